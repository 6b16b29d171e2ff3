// pipeline_result: peer to peer, a hop is answered at once (accepted, busy, or a
// kept reply) and its outcome comes back later as a request of its own, from the
// peer that took it to the peer that passed it on (docs/ARCHITECTURE.md, "Peer to
// peer"). The outcome is the gradient of the sender's output and the loss, or the
// error that ended the rest of the pipeline.
//
// The pipeline request names where the outcome goes (reply_to, the sender's peer
// id) and a token of the sender's (return_id); the result echoes the token and
// names its own sender. Who may deliver it is the receiver's to check
// (swarm/peer/hop_returns.h); this file checks its form.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "swarm/core/status.h"
#include "swarm/protocol/stage_protocol.h"
#include "swarm/wire/wire.h"

namespace swarm::protocol {

struct PipelineResult {
  uint64_t microbatch_id = 0;
  uint64_t return_id = 0;
  std::string from_peer;  // the sender's peer id, as it claims
  Result<StageReply> outcome = internal("no outcome");
};

// To the peer of `stage` that passed the pipeline on. A success carries the input
// gradient and the loss (with its metrics); an error, its code and text.
// `credential`: the sender's certificate in a swarm with an owner (as any stage request's).
Result<wire::Frames> encode_pipeline_result(int stage, uint64_t request_id, uint64_t microbatch_id,
                                            std::string_view from_peer, uint64_t return_id,
                                            const Result<StageReply>& outcome, std::string_view credential = {});

// Errors (invalid_argument): not a pipeline_result, no microbatch id, return_id or
// sender, an error code out of range, tensors with an error, or a success without
// exactly [gradient (float), loss and metrics (raw f32, rank 1)].
Result<PipelineResult> parse_pipeline_result(const wire::DecodedMessage& message);

// The answer "accepted" to a pipeline with a reply_to: a result without tensors.
// A pipeline's own reply always carries its loss, so the two cannot be confused.
wire::Frames encode_acceptance(uint64_t request_id, int stage);
bool is_acceptance(const wire::Frames& answer);

}  // namespace swarm::protocol
