// data_source: the DataSource concept, where a trainer's microbatches come from.
//
// A training loop asks each trainer's source for its next microbatch: the input
// the first stage takes and the targets the last stage takes, of any dtype and
// shape the stages' io_specs admit (tokens and next tokens for a language model;
// points and class ids for a classifier). `units` is what throughput counts:
// tokens for a language model, samples for most others. A source opts in with
// `using data_source_concept = swarm::data_source_t;`.
//
//   struct Points {
//     using data_source_concept = swarm::data_source_t;
//     swarm::Result<swarm::Microbatch> next();  // f32 [32, 2] points, i32 [32] classes
//   };
//   static_assert(swarm::DataSource<Points>);
//
// The loop calls next() of one source from one thread at a time; sources of
// different trainers are called concurrently.
#pragma once

#include <concepts>
#include <cstdint>

#include "swarm/core/status.h"
#include "swarm/core/tensor.h"

namespace swarm {

struct data_source_t {};

struct Microbatch {
  Tensor inputs;
  Tensor targets;
  int64_t units = 0;
};

template <typename D>
concept DataSource = std::same_as<typename D::data_source_concept, data_source_t> && std::movable<D> &&
                     requires(D& source) {
                       { source.next() } -> std::same_as<Result<Microbatch>>;
                     };

}  // namespace swarm
