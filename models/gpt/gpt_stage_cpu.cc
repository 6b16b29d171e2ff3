// The CPU instantiation of GptStage, in its own translation unit so that
// model users compile none of the model code.
#include "kernels/cpu/cpu_backend.h"
#include "models/gpt/gpt_stage_impl.h"

namespace swarm::gpt {

template class GptStage<CpuBackend>;

}  // namespace swarm::gpt
