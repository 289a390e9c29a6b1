#include "runtime/train/run_stats.hpp"

namespace lbbsp::runtime {

namespace {
// JSON has no NaN: the checkpointed statistics store it as null.
nlohmann::json num(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}
double num(const nlohmann::json& j) {
  return j.is_null() ? NAN : j.get<double>();
}
}  // namespace

nlohmann::json RunStats::to_json(double io_now) const {
  return nlohmann::json{{"train_time", train_time},
                        {"coord_time", coord_time},
                        {"wait_rank_time", wait_rank_time},
                        {"last_iter_s", last_iter_s},
                        {"epoch_loss", num(epoch_loss)},
                        {"last_train_loss", num(last_train_loss)},
                        {"epoch_samples", epoch_samples},
                        {"epoch_correct", epoch_correct},
                        {"last_test_acc", num(last_test_acc)},
                        {"last_test_loss", num(last_test_loss)},
                        {"time_to_target", time_to_target},
                        {"curve", curve},
                        {"predicted", predicted},
                        {"io_time", io_before + io_now}};
}

RunStats RunStats::from_json(const nlohmann::json& j) {
  RunStats s;
  s.train_time = j.at("train_time");
  s.coord_time = j.at("coord_time");
  s.wait_rank_time = j.at("wait_rank_time");
  s.last_iter_s = j.at("last_iter_s");
  s.epoch_loss = num(j.at("epoch_loss"));
  s.last_train_loss = num(j.at("last_train_loss"));
  s.epoch_samples = j.at("epoch_samples");
  s.epoch_correct = j.at("epoch_correct");
  s.last_test_acc = num(j.at("last_test_acc"));
  s.last_test_loss = num(j.at("last_test_loss"));
  s.time_to_target = j.at("time_to_target");
  s.curve = j.at("curve");
  s.predicted = j.at("predicted").get<std::vector<double>>();
  s.io_before = j.at("io_time");
  return s;
}

}  // namespace lbbsp::runtime
