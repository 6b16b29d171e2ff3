// gpt_stage_impl: the template definitions of GptStage. Included only by the
// translation units that instantiate it for one backend (gpt_stage_cpu.cc, and
// the CUDA one), so users of gpt_stage.h never compile the model code.
// The boundary layers at compressed stage cuts live in boundary.h; here they
// only bracket the blocks: receive, blocks, send.
#pragma once

#include <cmath>
#include <cstring>
#include <type_traits>

#include "models/gpt/boundary.h"
#include "models/gpt/gpt_stage.h"
#include "models/gpt/init.h"
#include "models/gpt/inputs.h"

namespace swarm::gpt {

template <Backend B>
struct GptStage<B>::State {
  // Activations and the weights the kernels read are value_type (float or
  // bf16); master weights, gradients and statistics stay float.
  using X = typename B::value_type;
  static constexpr bool kFloatValues = std::is_same_v<X, float>;
  static constexpr DType kValueDType = dtype_of_v<X>;
  // Fused ops a backend may offer beyond the concept (the CUDA one does).
  static constexpr bool kFusedResidualNorm = FusedResidualLayernormBackend<B>;
  static constexpr bool kFusedGelu = FusedMatmulGeluBackend<B>;

  struct BlockParams {
    int ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
  };
  struct BlockActivations {
    Tensor ln1, ln1_mean, ln1_rstd, qkv, att, atty, attproj, res2, ln2, ln2_mean, ln2_rstd, fch,
        fch_gelu, fcproj, res3;
  };

  // A parked forward: everything ensure_buffers() allocates, plus what the
  // forward was run on. Slots are swapped in and out of the State's own
  // members (Tensor swaps are pointer swaps), so the compute code is unchanged.
  struct Slot {
    int batch = 0, seq = 0;
    bool forward_done = false, have_targets = false;
    uint64_t fingerprint = 0;
    uint64_t last_use = 0;
    Tensor tokens, targets, input, embedded;
    std::vector<BlockActivations> acts;
    Tensor lnf, lnf_mean, lnf_rstd, logits, losses;
    Tensor grad_a, grad_b, dln, dqkv, datty, dfch, dfch_gelu, dlogits, dlnf;
    BoundaryActivations boundary;
  };
  static constexpr size_t kParkedForwards = 4;

  GptConfig config;
  StageLayout layout;
  std::vector<Slot> parked;
  uint64_t fingerprint = 0;  // of the active forward's input and targets
  uint64_t use_clock = 0;
  uint64_t recomputed = 0;
  std::vector<Parameter> params;
  // value_type copies of the master weights, refreshed before a forward
  // whenever the masters may have changed (unused when value_type is float).
  std::vector<Tensor> compute_values;
  bool compute_values_stale = true;
  int wte = -1, wpe = -1, lnf_w = -1, lnf_b = -1, head = -1;
  std::vector<BlockParams> blocks;
  // The cuts before and after this stage; none where there is no cut or it
  // does not compress.
  BoundaryLayer receive, send;
  BoundaryParamIndices receive_params, send_params;

  int batch = 0, seq = 0;
  float dloss = 1.0f;  // the last stage's output gradient, d(loss)
  bool forward_done = false;
  bool have_targets = false;
  Tensor tokens, targets, input, embedded;
  std::vector<BlockActivations> acts;  // layer_repeat * num_layers applications
  Tensor lnf, lnf_mean, lnf_rstd, logits, losses;
  Tensor grad_a, grad_b, dln, dqkv, datty, dfch, dfch_gelu, dlogits, dlnf;
  BoundaryActivations boundary;
  typename B::stream_type stream{};

  void swap_active(Slot& slot) {
    std::swap(batch, slot.batch);
    std::swap(seq, slot.seq);
    std::swap(forward_done, slot.forward_done);
    std::swap(have_targets, slot.have_targets);
    std::swap(fingerprint, slot.fingerprint);
    std::swap(tokens, slot.tokens);
    std::swap(targets, slot.targets);
    std::swap(input, slot.input);
    std::swap(embedded, slot.embedded);
    std::swap(acts, slot.acts);
    std::swap(lnf, slot.lnf);
    std::swap(lnf_mean, slot.lnf_mean);
    std::swap(lnf_rstd, slot.lnf_rstd);
    std::swap(logits, slot.logits);
    std::swap(losses, slot.losses);
    std::swap(grad_a, slot.grad_a);
    std::swap(grad_b, slot.grad_b);
    std::swap(dln, slot.dln);
    std::swap(dqkv, slot.dqkv);
    std::swap(datty, slot.datty);
    std::swap(dfch, slot.dfch);
    std::swap(dfch_gelu, slot.dfch_gelu);
    std::swap(dlogits, slot.dlogits);
    std::swap(dlnf, slot.dlnf);
    std::swap(boundary, slot.boundary);
  }

  // Before a new forward: park the active one (if any) in place of the least
  // recently used parked slot, whose buffers become the active ones.
  void park_active() {
    if (!forward_done) return;
    if (parked.size() < kParkedForwards) parked.emplace_back();
    Slot* victim = &parked[0];
    for (Slot& slot : parked) {
      if (!slot.forward_done) {
        victim = &slot;
        break;
      }
      if (slot.last_use < victim->last_use) victim = &slot;
    }
    swap_active(*victim);
    victim->last_use = ++use_clock;
  }

  // Makes the forward of `key` active if it is cached; false if not.
  bool activate(uint64_t key) {
    if (forward_done && fingerprint == key) return true;
    for (Slot& slot : parked) {
      if (slot.forward_done && slot.fingerprint == key) {
        swap_active(slot);
        slot.last_use = ++use_clock;
        return true;
      }
    }
    return false;
  }

  float* value(int index) { return params[index].value.template data<float>(); }
  float* grad(int index) { return params[index].grad.template data<float>(); }
  // The weights the kernels compute with.
  const X* w(int index) {
    if constexpr (kFloatValues) {
      return value(index);
    } else {
      return compute_values[index].template data<X>();
    }
  }
  static X* f(const Tensor& t) { return t.template data<X>(); }
  static float* stat(const Tensor& t) { return t.template data<float>(); }

  // The widths of the hidden tensors this stage takes and gives: d_model, or
  // d_model / k across a compressing cut.
  int input_width() const { return receive.wire_width(config.d_model); }
  int output_width() const { return send.wire_width(config.d_model); }

  BoundaryParams<B> boundary_params(const BoundaryParamIndices& indices) {
    BoundaryParams<B> p;
    auto bind = [&](int index, const X** weight, float** gradient) {
      if (index < 0) return;
      *weight = w(index);
      *gradient = grad(index);
    };
    bind(indices.ln_w, &p.ln_w, &p.ln_w_grad);
    bind(indices.ln_b, &p.ln_b, &p.ln_b_grad);
    bind(indices.proj_w, &p.proj_w, &p.proj_w_grad);
    bind(indices.proj_b, &p.proj_b, &p.proj_b_grad);
    return p;
  }

  Status refresh_compute_values() {
    if constexpr (!kFloatValues) {
      if (!compute_values_stale) return Status::ok();
      compute_values.resize(params.size());
      for (size_t i = 0; i < params.size(); ++i) {
        Tensor& c = compute_values[i];
        if (!c.defined() || c.shape() != params[i].value.shape()) {
          SWARM_ASSIGN_OR_RETURN(c, Tensor::empty(params[i].value.shape(), kValueDType, B::device));
        }
        B::to_values(c.template data<X>(), value(static_cast<int>(i)), c.numel(), stream);
      }
      compute_values_stale = false;
    }
    return Status::ok();
  }

  // A host f32 tensor into a device value_type buffer of the same size.
  Status upload_floats(const TensorView& host, Tensor& dst) {
    if constexpr (kFloatValues) {
      return dst.copy_from(host);
    } else {
      SWARM_ASSIGN_OR_RETURN(Tensor staged, Tensor::copy_of(host, B::device));
      B::to_values(f(dst), staged.template data<float>(), staged.numel(), stream);
      return B::synchronize(stream);  // `staged` is freed on return
    }
  }

  // A device value_type buffer as a host f32 tensor of `shape`.
  Result<Tensor> download_floats(const X* src, const Shape& shape) {
    SWARM_ASSIGN_OR_RETURN(Tensor host, Tensor::empty(shape, DType::f32, Device::cpu));
    if constexpr (kFloatValues) {
      SWARM_RETURN_IF_ERROR(B::synchronize(stream));
      SWARM_RETURN_IF_ERROR(host.copy_from(TensorView(const_cast<X*>(src), DType::f32, shape, B::device)));
    } else {
      SWARM_ASSIGN_OR_RETURN(Tensor staged, Tensor::empty(shape, DType::f32, B::device));
      B::to_floats(staged.template data<float>(), src, staged.numel(), stream);
      SWARM_RETURN_IF_ERROR(B::synchronize(stream));
      SWARM_RETURN_IF_ERROR(host.copy_from(staged));
    }
    return host;
  }

  int add_param(const std::string& name, Shape shape, InitKind kind, float stddev, uint64_t seed,
                Status* status) {
    auto host = make_initialized(name, shape, kind, stddev, seed);
    auto value_tensor = Tensor::copy_of(host, B::device);
    auto grad_tensor = Tensor::zeros(shape, DType::f32, B::device);
    if (!value_tensor.is_ok() || !grad_tensor.is_ok()) {
      *status = value_tensor.is_ok() ? grad_tensor.status() : value_tensor.status();
      return -1;
    }
    params.push_back({name, std::move(*value_tensor), std::move(*grad_tensor), kind == InitKind::normal});
    return static_cast<int>(params.size()) - 1;
  }

  Status ensure_buffers(int B_, int T_) {
    if (B_ == batch && T_ == seq) return Status::ok();
    batch = 0;
    seq = 0;
    forward_done = false;
    const int64_t N = static_cast<int64_t>(B_) * T_, C = config.d_model, V = config.vocab_size;
    auto make = [&](Tensor* t, Shape shape, DType dtype = kValueDType) -> Status {
      SWARM_ASSIGN_OR_RETURN(*t, Tensor::empty(shape, dtype, B::device));
      return Status::ok();
    };
    SWARM_RETURN_IF_ERROR(make(&tokens, Shape{N}, DType::i32));
    SWARM_RETURN_IF_ERROR(make(&targets, Shape{N}, DType::i32));
    SWARM_RETURN_IF_ERROR(make(&input, Shape{N, input_width()}));
    if (layout.has_embedding()) SWARM_RETURN_IF_ERROR(make(&embedded, Shape{N, C}));
    acts.resize(static_cast<size_t>(config.layer_repeat) * layout.num_layers());
    for (auto& a : acts) {
      SWARM_RETURN_IF_ERROR(make(&a.ln1, Shape{N, C}));
      SWARM_RETURN_IF_ERROR(make(&a.ln1_mean, Shape{N}, DType::f32));
      SWARM_RETURN_IF_ERROR(make(&a.ln1_rstd, Shape{N}, DType::f32));
      SWARM_RETURN_IF_ERROR(make(&a.qkv, Shape{N, 3 * C}));
      SWARM_RETURN_IF_ERROR(make(&a.att, Shape{B::attention_scratch_floats(B_, T_, config.n_heads)}, DType::f32));
      SWARM_RETURN_IF_ERROR(make(&a.atty, Shape{N, C}));
      SWARM_RETURN_IF_ERROR(make(&a.attproj, Shape{N, C}));
      SWARM_RETURN_IF_ERROR(make(&a.res2, Shape{N, C}));
      SWARM_RETURN_IF_ERROR(make(&a.ln2, Shape{N, C}));
      SWARM_RETURN_IF_ERROR(make(&a.ln2_mean, Shape{N}, DType::f32));
      SWARM_RETURN_IF_ERROR(make(&a.ln2_rstd, Shape{N}, DType::f32));
      SWARM_RETURN_IF_ERROR(make(&a.fch, Shape{N, 4 * C}));
      SWARM_RETURN_IF_ERROR(make(&a.fch_gelu, Shape{N, 4 * C}));
      SWARM_RETURN_IF_ERROR(make(&a.fcproj, Shape{N, C}));
      SWARM_RETURN_IF_ERROR(make(&a.res3, Shape{N, C}));
    }
    if (layout.has_head()) {
      SWARM_RETURN_IF_ERROR(make(&lnf, Shape{N, C}));
      SWARM_RETURN_IF_ERROR(make(&lnf_mean, Shape{N}, DType::f32));
      SWARM_RETURN_IF_ERROR(make(&lnf_rstd, Shape{N}, DType::f32));
      SWARM_RETURN_IF_ERROR(make(&logits, Shape{N, V}));
      SWARM_RETURN_IF_ERROR(make(&losses, Shape{N}, DType::f32));
      SWARM_RETURN_IF_ERROR(make(&dlogits, Shape{N, V}));
      SWARM_RETURN_IF_ERROR(make(&dlnf, Shape{N, C}));
    }
    SWARM_RETURN_IF_ERROR(make(&grad_a, Shape{N, C}));
    SWARM_RETURN_IF_ERROR(make(&grad_b, Shape{N, C}));
    SWARM_RETURN_IF_ERROR(make(&dln, Shape{N, C}));
    SWARM_RETURN_IF_ERROR(make(&dqkv, Shape{N, 3 * C}));
    SWARM_RETURN_IF_ERROR(make(&datty, Shape{N, C}));
    SWARM_RETURN_IF_ERROR(make(&dfch, Shape{N, 4 * C}));
    SWARM_RETURN_IF_ERROR(make(&dfch_gelu, Shape{N, 4 * C}));
    SWARM_RETURN_IF_ERROR(allocate_boundary_buffers<B>(boundary, send, receive, N, C));
    batch = B_;
    seq = T_;
    return Status::ok();
  }

  // The input of application `app`: the stage's residual stream (embedded,
  // received, or the input itself), or the previous block's output.
  const X* block_input(size_t app) {
    if (app > 0) return f(acts[app - 1].res3);
    if (layout.has_embedding()) return f(embedded);
    return receive.compresses() ? f(boundary.up_ln) : f(input);
  }
  const X* blocks_output() { return acts.empty() ? block_input(0) : f(acts.back().res3); }
  // What the stage hands on (the head's outputs aside).
  const X* stage_output() { return send.compresses() ? f(boundary.wire_out) : blocks_output(); }
  // Where backward_after_forward puts the output gradient it is given.
  Tensor& output_grad_buffer() { return send.compresses() ? boundary.wire_out_grad : grad_a; }

  // The forward of the resident inputs (tokens or input, and targets when
  // have_targets), all on the device.
  void compute_forward() {
    const int N = batch * seq, C = config.d_model, V = config.vocab_size;
    if (layout.has_embedding()) {
      B::embedding_forward(f(embedded), tokens.template data<int32_t>(), w(wte), w(wpe), batch, seq, C, V, stream);
    }
    if (receive.compresses()) {
      receiving_boundary_forward<B>(receive, boundary_params(receive_params), boundary, f(input), N, C, stream);
    }
    // Layer sharing applies each block layer_repeat times in a row, so a split
    // model is the same function as the unsplit one.
    for (size_t app = 0; app < acts.size(); ++app) {
      block_forward(block_input(app), acts[app], blocks[app / config.layer_repeat]);
    }
    if (send.compresses()) {
      sending_boundary_forward<B>(send, boundary_params(send_params), boundary, blocks_output(), N, C, stream);
    }
    if (!layout.has_head()) return;
    B::layernorm_forward(f(lnf), stat(lnf_mean), stat(lnf_rstd), blocks_output(), w(lnf_w), w(lnf_b), N, C, stream);
    B::matmul_forward(f(logits), f(lnf), w(head), static_cast<const X*>(nullptr), N, C, V, stream);
    if (have_targets) {
      B::cross_entropy_forward_backward(stat(losses), static_cast<X*>(nullptr), f(logits),
                                        targets.template data<int32_t>(), N, V, 0.0f, stream);
    }
  }

  // The backward of the resident forward, from d(loss) = dloss (last stage) or
  // the output gradient resident in output_grad_buffer(); returns the input
  // gradient (for the first stage, the embedding gradients are accumulated instead).
  const X* compute_backward() {
    const int N = batch * seq, C = config.d_model, V = config.vocab_size;
    const int64_t NC = int64_t{N} * C;
    X* d = f(grad_a);
    X* dx = f(grad_b);
    if (layout.has_head()) {
      const float scale = dloss / static_cast<float>(N);
      B::cross_entropy_forward_backward(stat(losses), f(dlogits), f(logits), targets.template data<int32_t>(), N, V,
                                        scale, stream);
      B::fill_zero(f(dlnf), NC, stream);
      B::matmul_backward(f(dlnf), grad(head), static_cast<float*>(nullptr), f(dlogits), f(lnf), w(head), N, C, V,
                         stream);
      B::fill_zero(d, NC, stream);
      B::layernorm_backward(d, grad(lnf_w), grad(lnf_b), f(dlnf), blocks_output(), w(lnf_w), stat(lnf_mean),
                            stat(lnf_rstd), N, C, stream);
    }
    if (send.compresses()) {
      sending_boundary_backward<B>(send, boundary_params(send_params), boundary, blocks_output(), d, N, C, stream);
    }
    for (size_t app = acts.size(); app-- > 0;) {
      block_backward(block_input(app), acts[app], blocks[app / config.layer_repeat], d, dx);
      std::swap(d, dx);
    }
    if (receive.compresses()) {
      return receiving_boundary_backward<B>(receive, boundary_params(receive_params), boundary, f(input), d, N, C,
                                            stream);
    }
    if (layout.has_embedding()) {
      B::embedding_backward(grad(wte), grad(wpe), d, tokens.template data<int32_t>(), batch, seq, C, V, stream);
    }
    return d;
  }

  void block_forward(const X* x, BlockActivations& a, const BlockParams& p) {
    const int N = batch * seq, C = config.d_model, NH = config.n_heads;
    B::layernorm_forward(f(a.ln1), stat(a.ln1_mean), stat(a.ln1_rstd), x, w(p.ln1_w), w(p.ln1_b), N, C, stream);
    B::matmul_forward(f(a.qkv), f(a.ln1), w(p.qkv_w), w(p.qkv_b), N, C, 3 * C, stream);
    B::attention_forward(f(a.atty), stat(a.att), f(a.qkv), batch, seq, C, NH, stream);
    B::matmul_forward(f(a.attproj), f(a.atty), w(p.proj_w), w(p.proj_b), N, C, C, stream);
    if constexpr (kFusedResidualNorm) {
      B::residual_layernorm_forward(f(a.res2), f(a.ln2), stat(a.ln2_mean), stat(a.ln2_rstd), x, f(a.attproj),
                                    w(p.ln2_w), w(p.ln2_b), N, C, stream);
    } else {
      B::residual_forward(f(a.res2), x, f(a.attproj), int64_t{N} * C, stream);
      B::layernorm_forward(f(a.ln2), stat(a.ln2_mean), stat(a.ln2_rstd), f(a.res2), w(p.ln2_w), w(p.ln2_b), N, C, stream);
    }
    if constexpr (kFusedGelu) {
      B::matmul_gelu_forward(f(a.fch_gelu), f(a.fch), f(a.ln2), w(p.fc_w), w(p.fc_b), N, C, 4 * C, stream);
    } else {
      B::matmul_forward(f(a.fch), f(a.ln2), w(p.fc_w), w(p.fc_b), N, C, 4 * C, stream);
      B::gelu_forward(f(a.fch_gelu), f(a.fch), int64_t{N} * 4 * C, stream);
    }
    B::matmul_forward(f(a.fcproj), f(a.fch_gelu), w(p.fcproj_w), w(p.fcproj_b), N, 4 * C, C, stream);
    B::residual_forward(f(a.res3), f(a.res2), f(a.fcproj), int64_t{N} * C, stream);
  }

  // d holds dL/d(block output) and is consumed; dx receives dL/d(block input).
  void block_backward(const X* x, BlockActivations& a, const BlockParams& p, X* d, X* dx) {
    const int N = batch * seq, C = config.d_model, NH = config.n_heads;
    const int64_t NC = int64_t{N} * C;
    if constexpr (kFusedGelu) {
      B::matmul_backward_dgelu(f(dfch), grad(p.fcproj_w), grad(p.fcproj_b), d, f(a.fch_gelu), w(p.fcproj_w),
                               f(a.fch), N, 4 * C, C, stream);
    } else {
      B::fill_zero(f(dfch_gelu), NC * 4, stream);
      B::matmul_backward(f(dfch_gelu), grad(p.fcproj_w), grad(p.fcproj_b), d, f(a.fch_gelu), w(p.fcproj_w), N, 4 * C, C, stream);
      B::fill_zero(f(dfch), NC * 4, stream);
      B::gelu_backward(f(dfch), f(a.fch), f(dfch_gelu), NC * 4, stream);
    }
    B::fill_zero(f(dln), NC, stream);
    B::matmul_backward(f(dln), grad(p.fc_w), grad(p.fc_b), f(dfch), f(a.ln2), w(p.fc_w), N, C, 4 * C, stream);
    // res3 = res2 + fcproj, so d becomes dL/d(res2) once LN2's gradient is added.
    B::layernorm_backward(d, grad(p.ln2_w), grad(p.ln2_b), f(dln), f(a.res2), w(p.ln2_w), stat(a.ln2_mean), stat(a.ln2_rstd), N, C, stream);
    B::fill_zero(f(datty), NC, stream);
    B::matmul_backward(f(datty), grad(p.proj_w), grad(p.proj_b), d, f(a.atty), w(p.proj_w), N, C, C, stream);
    B::fill_zero(f(dqkv), NC * 3, stream);
    B::attention_backward(f(dqkv), stat(a.att), f(datty), f(a.qkv), f(a.atty), batch, seq, C, NH, stream);
    B::fill_zero(f(dln), NC, stream);
    B::matmul_backward(f(dln), grad(p.qkv_w), grad(p.qkv_b), f(dqkv), f(a.ln1), w(p.qkv_w), N, C, 3 * C, stream);
    // res2 = x + attproj: dx = dres2 + LN1's input gradient.
    B::fill_zero(dx, NC, stream);
    B::accumulate(dx, d, NC, stream);
    B::layernorm_backward(dx, grad(p.ln1_w), grad(p.ln1_b), f(dln), x, w(p.ln1_w), stat(a.ln1_mean), stat(a.ln1_rstd), N, C, stream);
  }
};

template <Backend B>
Result<GptStage<B>> GptStage<B>::create(const GptConfig& config, const StageLayout& layout,
                                        uint64_t seed) {
  SWARM_RETURN_IF_ERROR(config.validate());
  if (layout.num_stages <= 0 || layout.stage_index < 0 || layout.stage_index >= layout.num_stages ||
      layout.first_layer < 0 || layout.end_layer > config.n_layers ||
      layout.first_layer >= layout.end_layer) {
    return invalid_argument("invalid stage layout: stage {} of {}, layers [{}, {}) of {}",
                            layout.stage_index, layout.num_stages, layout.first_layer,
                            layout.end_layer, config.n_layers);
  }
  SWARM_RETURN_IF_ERROR(config.check_boundaries_fit(layout.num_stages));
  // The cut before stage i is the one after stage i - 1.
  const BoundaryLayer receive =
      layout.has_embedding() ? BoundaryLayer{} : config.boundary_after(layout.stage_index - 1);
  const BoundaryLayer send = layout.has_head() ? BoundaryLayer{} : config.boundary_after(layout.stage_index);
  if (send.kind == BoundaryKind::maxout && !MaxoutBackend<B>) {
    return unimplemented("stage {} ends in a {} boundary layer, but this backend has no maxout op (MaxoutBackend)",
                         layout.stage_index, send.to_string());
  }
  SWARM_RETURN_IF_ERROR(B::initialize());
  auto state = std::make_unique<State>();
  state->config = config;
  state->layout = layout;
  state->receive = receive;
  state->send = send;
  const int64_t C = config.d_model, V = config.vocab_size;
  // GPT-2: residual projections shrink with depth so the residual stream keeps its scale.
  const float residual_std = 0.02f / std::sqrt(2.0f * config.n_layers * config.layer_repeat);
  Status status;
  auto add = [&](const std::string& name, Shape shape, InitKind kind, float stddev = 0.02f) {
    return state->add_param(name, shape, kind, stddev, seed, &status);
  };
  if (layout.has_embedding()) {
    state->wte = add("wte", Shape{V, C}, InitKind::normal);
    state->wpe = add("wpe", Shape{config.max_seq_len, C}, InitKind::normal, 0.01f);
  }
  state->receive_params = add_receiving_boundary_params(receive, layout.stage_index - 1, C, add);
  for (int layer = layout.first_layer; layer < layout.end_layer; ++layer) {
    const std::string prefix = "h." + std::to_string(layer) + ".";
    typename State::BlockParams p{};
    p.ln1_w = add(prefix + "ln1.weight", Shape{C}, InitKind::ones);
    p.ln1_b = add(prefix + "ln1.bias", Shape{C}, InitKind::zeros);
    p.qkv_w = add(prefix + "attn.qkv.weight", Shape{3 * C, C}, InitKind::normal);
    p.qkv_b = add(prefix + "attn.qkv.bias", Shape{3 * C}, InitKind::zeros);
    p.proj_w = add(prefix + "attn.proj.weight", Shape{C, C}, InitKind::normal, residual_std);
    p.proj_b = add(prefix + "attn.proj.bias", Shape{C}, InitKind::zeros);
    p.ln2_w = add(prefix + "ln2.weight", Shape{C}, InitKind::ones);
    p.ln2_b = add(prefix + "ln2.bias", Shape{C}, InitKind::zeros);
    p.fc_w = add(prefix + "mlp.fc.weight", Shape{4 * C, C}, InitKind::normal);
    p.fc_b = add(prefix + "mlp.fc.bias", Shape{4 * C}, InitKind::zeros);
    p.fcproj_w = add(prefix + "mlp.proj.weight", Shape{C, 4 * C}, InitKind::normal, residual_std);
    p.fcproj_b = add(prefix + "mlp.proj.bias", Shape{C}, InitKind::zeros);
    state->blocks.push_back(p);
  }
  state->send_params = add_sending_boundary_params(send, layout.stage_index, C, add);
  if (layout.has_head()) {
    state->lnf_w = add("lnf.weight", Shape{C}, InitKind::ones);
    state->lnf_b = add("lnf.bias", Shape{C}, InitKind::zeros);
    state->head = add("lm_head.weight", Shape{V, C}, InitKind::normal);
  }
  SWARM_RETURN_IF_ERROR(status);
  return GptStage(std::move(state));
}

template <Backend B>
GptStage<B>::GptStage(std::unique_ptr<State> state) : state_(std::move(state)) {}
template <Backend B>
GptStage<B>::GptStage(GptStage&&) noexcept = default;
template <Backend B>
GptStage<B>& GptStage<B>::operator=(GptStage&&) noexcept = default;
template <Backend B>
GptStage<B>::~GptStage() = default;

template <Backend B>
const GptConfig& GptStage<B>::config() const { return state_->config; }
template <Backend B>
const StageLayout& GptStage<B>::layout() const { return state_->layout; }

template <Backend B>
StageIoSpec GptStage<B>::io_spec() const {
  const TensorSpec tokens{DType::i32, {-1, -1}};
  const TensorSpec hidden_in{DType::f32, {-1, -1, state_->input_width()}};
  const TensorSpec hidden_out{DType::f32, {-1, -1, state_->output_width()}};
  StageIoSpec spec{layout().has_embedding() ? tokens : hidden_in, std::nullopt, hidden_out};
  if (layout().has_head()) {
    spec.targets = tokens;
    spec.output = TensorSpec{DType::f32, {1}};
  }
  return spec;
}
template <Backend B>
std::vector<Parameter>& GptStage<B>::parameters() {
  state_->compute_values_stale = true;  // the caller may write the masters
  return state_->params;
}
template <Backend B>
const std::vector<Parameter>& GptStage<B>::parameters() const { return state_->params; }

template <Backend B>
std::vector<StageParameterView> GptStage<B>::parameter_views() {
  state_->compute_values_stale = true;
  std::vector<StageParameterView> views;
  for (auto& p : state_->params) views.push_back({p.name, p.value, p.grad, p.apply_weight_decay});
  return views;
}

template <Backend B>
Status GptStage<B>::zero_grad() {
  for (auto& p : state_->params) B::fill_zero(p.grad.template data<float>(), p.grad.numel(), state_->stream);
  return B::synchronize(state_->stream);
}

template <Backend B>
Result<Tensor> GptStage<B>::forward(const TensorView& in, const TensorView* targets) {
  State& s = *state_;
  const GptConfig& cfg = s.config;
  SWARM_RETURN_IF_ERROR(s.layout.has_embedding()
                            ? validate_tokens(in, cfg, "input tokens")
                            : validate_hidden(in, cfg, s.input_width(), "input hidden states"));
  const int batch = static_cast<int>(in.shape()[0]), seq = static_cast<int>(in.shape()[1]);
  if (targets != nullptr) {
    if (!s.layout.has_head()) return invalid_argument("only the last stage takes targets");
    SWARM_RETURN_IF_ERROR(validate_tokens(*targets, cfg, "targets"));
    if (targets->shape()[0] != batch || targets->shape()[1] != seq) {
      return invalid_argument("targets {} do not match the input's [{}, {}]",
                              targets->shape().to_string(), batch, seq);
    }
  }
  s.park_active();
  SWARM_RETURN_IF_ERROR(s.ensure_buffers(batch, seq));
  SWARM_RETURN_IF_ERROR(s.refresh_compute_values());
  s.forward_done = false;
  s.fingerprint = input_fingerprint(in, targets);
  const int N = batch * seq, V = cfg.vocab_size;

  if (s.layout.has_embedding()) {
    SWARM_RETURN_IF_ERROR(s.tokens.copy_from(*in.reshaped(Shape{N})));
  } else {
    SWARM_RETURN_IF_ERROR(s.upload_floats(*in.reshaped(Shape{N, s.input_width()}), s.input));
  }
  s.have_targets = targets != nullptr;
  if (s.have_targets) SWARM_RETURN_IF_ERROR(s.targets.copy_from(*targets->reshaped(Shape{N})));
  s.compute_forward();
  if (!s.layout.has_head()) {
    auto out = s.download_floats(s.stage_output(), Shape{batch, seq, s.output_width()});
    if (out.is_ok()) s.forward_done = true;
    return out;
  }
  if (targets == nullptr) {
    auto out = s.download_floats(State::f(s.logits), Shape{batch, seq, V});
    if (out.is_ok()) s.forward_done = true;
    return out;
  }
  SWARM_RETURN_IF_ERROR(B::synchronize(s.stream));
  SWARM_ASSIGN_OR_RETURN(Tensor host_losses, Tensor::copy_of(s.losses, Device::cpu));
  double total = 0;
  for (float l : host_losses.template span<float>()) total += l;
  SWARM_ASSIGN_OR_RETURN(Tensor loss, Tensor::empty(Shape{1}, DType::f32, Device::cpu));
  loss.template data<float>()[0] = static_cast<float>(total / N);
  s.forward_done = true;
  return loss;
}

template <Backend B>
Result<Tensor> GptStage<B>::backward_after_forward(const TensorView& grad_output) {
  State& s = *state_;
  using X = typename State::X;
  if (!s.forward_done) return failed_precondition("backward_after_forward without a forward");
  const int N = s.batch * s.seq;
  if (s.layout.has_head()) {
    if (!s.have_targets) return failed_precondition("the last stage's backward needs targets");
    if (grad_output.dtype() != DType::f32 || grad_output.numel() != 1) {
      return invalid_argument("the last stage's output gradient is d(loss), f32 [1]; got {}",
                              grad_output.describe());
    }
    SWARM_ASSIGN_OR_RETURN(Tensor dloss, Tensor::copy_of(grad_output, Device::cpu));
    s.dloss = dloss.template data<float>()[0];
  } else {
    const int width = s.output_width();
    SWARM_RETURN_IF_ERROR(validate_hidden(grad_output, s.config, width, "output gradient"));
    if (grad_output.shape()[0] != s.batch || grad_output.shape()[1] != s.seq) {
      return invalid_argument("output gradient {} does not match the forward's [{}, {}, {}]",
                              grad_output.shape().to_string(), s.batch, s.seq, width);
    }
    SWARM_RETURN_IF_ERROR(s.upload_floats(*grad_output.reshaped(Shape{N, width}), s.output_grad_buffer()));
  }
  const X* input_grad = s.compute_backward();
  if (s.layout.has_embedding()) {
    SWARM_RETURN_IF_ERROR(B::synchronize(s.stream));
    return Tensor();
  }
  return s.download_floats(input_grad, Shape{s.batch, s.seq, s.input_width()});
}

template <Backend B>
Result<Tensor> GptStage<B>::backward(const TensorView& input, const TensorView& grad_output,
                                     const TensorView* targets) {
  // A forward of this very input still parked here saves the recompute. It is
  // exact: parked forwards are dropped whenever the parameters change.
  const uint64_t key = input_fingerprint(input, targets);
  if (key == 0 || !state_->activate(key)) {
    ++state_->recomputed;
    SWARM_RETURN_IF_ERROR(forward(input, targets).status());
  }
  return backward_after_forward(grad_output);
}

template <Backend B>
Status GptStage<B>::replay_resident_step() {
  State& s = *state_;
  if (!s.forward_done) return failed_precondition("replay_resident_step without a forward");
  if (s.layout.has_head() && !s.have_targets) {
    return failed_precondition("replay_resident_step on the last stage needs a forward with targets");
  }
  s.compute_forward();
  s.compute_backward();
  return B::synchronize(s.stream);
}

template <Backend B>
uint64_t GptStage<B>::recomputed_forwards() const {
  return state_->recomputed;
}

template <Backend B>
void GptStage<B>::drop_cached_activations() {
  state_->compute_values_stale = true;
  state_->forward_done = false;
  for (auto& slot : state_->parked) slot.forward_done = false;
}

}  // namespace swarm::gpt
