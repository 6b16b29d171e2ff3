// owned_message: a decoded message that owns its bytes. A server's handler gets a
// DecodedMessage whose tensors point into the request's frames, which live only
// for the call; work that outlives the call (a pipeline answered at once) keeps a
// copy, with the same header and tensors, pointing into memory of its own.
//
//   auto owned = swarm::wire::OwnedMessage::copy_of(message);   // in the handler
//   run_later([owned] { use(owned->message); });
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "swarm/wire/wire.h"

namespace swarm::wire {

struct OwnedMessage {
  std::vector<std::string> payloads;  // never resized after copy_of: the views point into it
  DecodedMessage message;

  static std::shared_ptr<const OwnedMessage> copy_of(const DecodedMessage& decoded) {
    auto owned = std::make_shared<OwnedMessage>();
    owned->message.header = decoded.header;
    owned->payloads.reserve(decoded.tensors.size());
    for (const DecodedTensor& tensor : decoded.tensors) {
      std::string& bytes = owned->payloads.emplace_back(tensor.payload);
      DecodedTensor copy = tensor;
      copy.payload = bytes;
      if (tensor.view.raw_data() != nullptr) copy.view = TensorView(bytes.data(), tensor.view.dtype(), tensor.view.shape());
      owned->message.tensors.push_back(std::move(copy));
    }
    return owned;
  }
};

}  // namespace swarm::wire
