// any_stage_serving: `swarm peer` for a model whose stages the program holds
// behind AnyStage, through a Peer compiled once here rather than in every
// model's program, so that an edit of a model's stage rebuilds only the model's
// code. A model's plug-in (apps/cli/model.h) serves its stages this way unless
// it serves them itself.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "swarm/core/status.h"
#include "swarm/stages/any_stage.h"

namespace swarm::apps {

struct PeerServing;  // apps/peer_serving.h

// Builds the stage of an index with the peer's seed.
using AnyStageFactory = std::function<Result<AnyStage>(int stage_index, uint64_t seed)>;

// Serves the stages `make_stage` builds on the CPU (fp32), moving between them as
// rebalancing asks, until a stop signal; the exit status (2: the peer's --device
// is not the CPU's fp32, which a model without its own serving computes on).
int serve_cpu_stages(const PeerServing& serving, const std::string& model_name, AnyStageFactory make_stage);

}  // namespace swarm::apps
