// The trainer's choices as enums. Strings exist only at the CLI edge: parse_enum<E>(flag, text) turns a
// flag's value into one, enum_name(value) gives the flag's spelling back (logs, summary JSON, checkpoints).
#pragma once
#include <stdexcept>
#include <string>
#include <utility>

#include "models/device.hpp"

namespace lbbsp::runtime {

using Device = models::Device;                           // --device
enum class GpuParams { kDevice, kHost };                 // --gpu-params: where a CUDA model's parameters live
enum class GpuAllreduce { kAuto, kStaged, kCudaAware };  // --gpu-allreduce: how a device gradient is reduced
enum class HostAllreduce { kAuto, kMpi, kNode };         // --allreduce: how a host gradient is reduced
enum class Binding { kNone, kCore };                     // --bind

// Each enum's spellings, in the order the error message lists them.
template <class E>
struct EnumNames;
template <>
struct EnumNames<Device> {
  static constexpr std::pair<Device, const char*> table[] = {{Device::kCpu, "cpu"}, {Device::kCuda, "cuda"}};
};
template <>
struct EnumNames<GpuParams> {
  static constexpr std::pair<GpuParams, const char*> table[] = {{GpuParams::kDevice, "device"},
                                                                {GpuParams::kHost, "host"}};
};
template <>
struct EnumNames<GpuAllreduce> {
  static constexpr std::pair<GpuAllreduce, const char*> table[] = {{GpuAllreduce::kAuto, "auto"},
                                                                   {GpuAllreduce::kStaged, "staged"},
                                                                   {GpuAllreduce::kCudaAware, "cuda-aware"}};
};
template <>
struct EnumNames<HostAllreduce> {
  static constexpr std::pair<HostAllreduce, const char*> table[] = {
      {HostAllreduce::kAuto, "auto"}, {HostAllreduce::kMpi, "mpi"}, {HostAllreduce::kNode, "node"}};
};
template <>
struct EnumNames<Binding> {
  static constexpr std::pair<Binding, const char*> table[] = {{Binding::kCore, "core"},
                                                              {Binding::kNone, "none"}};
};

template <class E>
const char* enum_name(E value) {
  for (const auto& [e, name] : EnumNames<E>::table)
    if (e == value) return name;
  throw std::logic_error("enum_name: value without a name");
}

// "a, b or c": the spellings for an error message.
template <class E>
std::string enum_choices() {
  std::string out;
  const size_t n = std::size(EnumNames<E>::table);
  for (size_t i = 0; i < n; ++i)
    out += std::string(i == 0 ? "" : i + 1 == n ? " or " : ", ") + EnumNames<E>::table[i].second;
  return out;
}

// Throws std::invalid_argument "FLAG: unknown value 'TEXT' (expected a, b or c)".
template <class E>
E parse_enum(const std::string& flag, const std::string& text) {
  for (const auto& [e, name] : EnumNames<E>::table)
    if (text == name) return e;
  throw std::invalid_argument(flag + ": unknown value '" + text + "' (expected " + enum_choices<E>() + ")");
}

}  // namespace lbbsp::runtime
