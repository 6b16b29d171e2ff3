// GptStage<CudaBf16CudnnBackend>, in its own translation unit: each CUDA instantiation
// compiles separately, so none of them slows the others' builds.
#include "kernels/cuda/cuda_backend.h"
#include "models/gpt/gpt_stage_impl.h"

namespace swarm::gpt {

template class GptStage<CudaBf16CudnnBackend>;

}  // namespace swarm::gpt
