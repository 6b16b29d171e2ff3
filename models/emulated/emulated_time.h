// emulated_time: what the emulated stages share: the wall time a number of
// FLOPs takes at a rate, a wait for it that does not overshoot, and tensors
// whose values follow their input.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>

#include "swarm/core/status.h"
#include "swarm/core/tensor.h"

namespace swarm::emulated {

using EmulatedClock = std::chrono::steady_clock;

// Tokens in a [B, T, ...] or [B, T] tensor; 0 for anything of lower rank.
inline double tokens_of(const TensorView& input) {
  return input.shape().rank() >= 2 ? static_cast<double>(input.shape()[0]) * static_cast<double>(input.shape()[1])
                                   : 0.0;
}

inline EmulatedClock::duration seconds_for(double flops, double flops_per_second) {
  return std::chrono::duration_cast<EmulatedClock::duration>(std::chrono::duration<double>(flops / flops_per_second));
}

// A plain sleep overshoots by tens of microseconds, a tenth of the smallest
// emulated compute; the last stretch spins so the stage is as fast as claimed.
inline void wait_until(EmulatedClock::time_point until) {
  constexpr auto kSpin = std::chrono::microseconds(300);
  if (EmulatedClock::now() + kSpin < until) std::this_thread::sleep_until(until - kSpin);
  while (EmulatedClock::now() < until) {
  }
}

// [B, T, width] whose row r repeats row r of the f32 [B, T, W] `source` cyclically,
// so a lossy codec sees values shaped like the ones it was sent.
inline Result<Tensor> follow(const TensorView& source, int64_t width) {
  const int64_t rows = source.shape()[0] * source.shape()[1];
  const int64_t source_width = source.shape()[2];
  SWARM_ASSIGN_OR_RETURN(Tensor out, Tensor::empty(Shape{source.shape()[0], source.shape()[1], width}, DType::f32));
  const float* in = source.data<float>();
  float* o = out.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < width; ++c) o[r * width + c] = in[r * source_width + c % source_width];
  }
  return out;
}

}  // namespace swarm::emulated
