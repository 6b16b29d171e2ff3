// tensor_codec: host tensors to wire payloads and back, through a CodecTable.
//
// The runtimes are templates over the table, so they name a codec by its id and
// never include an implementation (apps pass compression::StandardCodecs).
// Decoding is where untrusted bytes become numbers: sizes were checked by the wire,
// and the codec refuses non-finite values, so what comes out is finite.
//
//   SWARM_ASSIGN_OR_RETURN(wire::EncodedTensor out, encode_floats<Codecs>(output, CodecId::blockwise8));
//   Tensor storage;
//   SWARM_ASSIGN_OR_RETURN(TensorView x, float_view<Codecs>(*call.input, &storage));
#pragma once

#include <cmath>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>

#include "swarm/api/codec.h"
#include "swarm/core/status.h"
#include "swarm/core/tensor.h"
#include "swarm/protocol/stage_protocol.h"
#include "swarm/wire/wire.h"

namespace swarm::protocol {

// An f32 host tensor in `codec`; any other dtype travels raw (shared, not copied).
template <CodecTable Codecs>
Result<wire::EncodedTensor> encode_floats(const Tensor& tensor, CodecId codec) {
  if (tensor.dtype() != DType::f32 || codec == CodecId::none) return raw_tensor(tensor);
  if (tensor.device() != Device::cpu) return invalid_argument("encode_floats: the tensor is not on the CPU");
  if (!Codecs::supports(codec)) return unimplemented("codec {} is not available here", codec_name(codec));
  const auto n = static_cast<uint64_t>(tensor.numel());
  SWARM_ASSIGN_OR_RETURN(uint64_t bytes, Codecs::encoded_bytes(codec, n));
  std::string payload(static_cast<std::size_t>(bytes), '\0');
  SWARM_RETURN_IF_ERROR(Codecs::encode(codec, std::span<const float>(tensor.data<float>(), n),
                                       std::as_writable_bytes(std::span<char>(payload.data(), payload.size()))));
  const auto& dims = tensor.shape().dims();
  return wire::EncodedTensor{DType::f32, codec, std::vector<int64_t>(dims.begin(), dims.end()),
                             wire::Frame(std::move(payload))};
}

// The values of a received tensor: a view into the frame for raw payloads (no
// copy), or decoded into *storage.
template <CodecTable Codecs>
Result<TensorView> float_view(const wire::DecodedTensor& tensor, Tensor* storage) {
  if (tensor.codec == CodecId::none) return tensor.view;
  if (!Codecs::supports(tensor.codec)) return unimplemented("codec {} is not available here", codec_name(tensor.codec));
  SWARM_ASSIGN_OR_RETURN(*storage, Tensor::empty(tensor.shape, DType::f32));
  SWARM_RETURN_IF_ERROR(Codecs::decode(tensor.codec, std::as_bytes(std::span(tensor.payload.data(), tensor.payload.size())),
                                       storage->span<float>()));
  return storage->view();
}

// An owned copy of a received tensor's values.
template <CodecTable Codecs>
Result<Tensor> decode_tensor(const wire::DecodedTensor& tensor) {
  Tensor storage;
  SWARM_ASSIGN_OR_RETURN(TensorView view, float_view<Codecs>(tensor, &storage));
  if (storage.defined()) return storage;
  return Tensor::copy_of(view);
}

// An owned f32 tensor of bytes a peer sent (a pipeline's gradient from the next
// stage). The wire checked the payload's size against dtype, shape and codec.
template <CodecTable Codecs>
Result<Tensor> decode_encoded(const wire::EncodedTensor& tensor) {
  if (tensor.dtype != DType::f32) return invalid_argument("expected f32 values, got {}", dtype_name(tensor.dtype));
  SWARM_ASSIGN_OR_RETURN(Shape shape, Shape::from_dims(tensor.dims));
  SWARM_ASSIGN_OR_RETURN(Tensor out, Tensor::empty(shape, DType::f32));
  const std::string_view bytes = tensor.payload.view();
  if (tensor.codec == CodecId::none) {
    if (bytes.size() != static_cast<size_t>(out.numel()) * sizeof(float)) {
      return invalid_argument("{} raw bytes for {} values", bytes.size(), out.numel());
    }
    std::memcpy(out.data<float>(), bytes.data(), bytes.size());
    for (float v : out.span<float>()) {
      if (!std::isfinite(v)) return invalid_argument("a non-finite value");
    }
    return out;
  }
  if (!Codecs::supports(tensor.codec)) return unimplemented("codec {} is not available here", codec_name(tensor.codec));
  SWARM_RETURN_IF_ERROR(Codecs::decode(tensor.codec, std::as_bytes(std::span(bytes.data(), bytes.size())),
                                       out.span<float>()));
  return out;
}

}  // namespace swarm::protocol
