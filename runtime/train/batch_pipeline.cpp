#include "runtime/train/batch_pipeline.hpp"

#include "balancer/balancer.hpp"
#include "runtime/platform/comm.hpp"
#include "runtime/train/batch_manager.hpp"
#include "runtime/train/reduction_buffer.hpp"

namespace lbbsp::runtime {

void BatchPipeline::before_allreduce(ReductionBuffer& buf) {
  if (manager_ && lag_ > 0) buf.set_next_batch(manager_->next());
}

std::vector<int64_t> BatchPipeline::after_allreduce(
    const ReductionBuffer& buf, Comm& comm, const std::function<balancer::IterationReport()>& report) {
  if (manager_) manager_->decide(report());
  if (lag_ > 0) return buf.next_batch();  // what rank 0 put in before the allreduce
  std::vector<int64_t> next(buf.ranks(), 0);
  if (manager_) next = manager_->next();
  comm.bcast(next.data(), next.size());
  return next;
}

}  // namespace lbbsp::runtime
