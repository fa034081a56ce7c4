// decoder_layers: every decoder layer of a decode step in one op, the kernels called back to back.
//
// A decode step of a 30-layer model on a few rows spends about as long in Python and torch's
// dispatcher between its ops (views, reshapes, wrappers: some 1,700 ops a step) as its kernels
// take to read the weights. This op runs the fused layers' own sequence of kernels from C++,
// per layer, each part present or not as the layer's spec says (engine/kernels/layer_spec.py):
//
//     h   = pre_attn(x)                               // or x, without the norm (OLMo 2)
//     qkv = gemv(h, [Wq; Wk; Wv]) (+ bias)            // [T, (H + 2 H_kv) D]
//     q,k = q_norm(q), k_norm(k)                      // per head, or over all heads
//     a   = decode_step(qkv, cos, sin', K, V, ...)    // rotary (of R <= D dims), KV write,
//                                                     // attention (scores soft-capped): [T, H D]
//     x   = x + post_attn(gemv(a, Wo)) * m            // gemv(a, Wo) + x in the kernel's store
//     h   = pre_mlp(x)
//     gu  = gemv(h, [Wg; Wu])                         // [T, 2 I]
//     x   = x + post_mlp(gemv(act(g) * u, Wd)) * m    // act: SiLU or GELU-tanh
//
// with the same functions the torch ops run, on the same inputs, so the bits are those of the
// Python loop in engine/kernels/fused_layers.py (its _norm, _qk_norm, _residual). vLLM and
// SGLang reach the same end on the CPU by compiling the model (vllm/compilation/backends.py;
// sglang's cpu_graph_runner.py, "reducing python overhead on CPU"); here the step's shape never
// changes, so a loop in C++ serves.
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/rms_norm.h>
#include <ATen/ops/silu.h>
#include <torch/library.h>

#include "ops.h"

#include <optional>
#include <vector>

namespace {

constexpr int64_t kNorms = 6;    // per layer: pre_attn, post_attn, pre_mlp, post_mlp, q, k
constexpr int64_t kFlags = 4;    // per layer: norm bits, QK-norm per head, activation, window
constexpr int64_t kLayerOps = 1 << kNorms;  // norm bits: 1 << n upcast norm n; this: cbp_layer's
enum Activation : int64_t { kSilu = 0, kGeluTanh = 1, kSiluMul = 2 };  // kSiluMul: cbp_layer's
constexpr int64_t kNumbers = 9;  // per layer: six norms' eps, attention scale, residual mult.,
                                 // score soft cap (0: none)

struct Layer {
  const std::optional<at::Tensor>* norms;  // kNorms
  const int64_t* flags;                    // kFlags
  const double* numbers;                   // kNumbers
};

// An RMSNorm over the last dimension as fused_layers.FusedDecoder._norm computes it.
at::Tensor norm(const at::Tensor& x, const Layer& layer, int64_t which) {
  const at::Tensor& weight = *layer.norms[which];
  double eps = layer.numbers[which];
  std::vector<int64_t> width{x.size(-1)};
  if (x.scalar_type() == at::kFloat) return at::rms_norm(x, width, weight, eps);
  if (layer.flags[0] >> which & 1) {  // scaled in float32, cast after (Gemma's, OLMo 2's)
    return at::mul(at::rms_norm(x.to(at::kFloat), width, {}, eps), weight).to(x.scalar_type());
  }
  if (x.dim() == 2 && layer.flags[0] & kLayerOps) return cbp::rms_norm_bf16(x, weight, eps);
  return at::mul(at::rms_norm(x.to(at::kFloat), width, {}, eps).to(x.scalar_type()), weight);
}

at::Tensor maybe_norm(const at::Tensor& x, const Layer& layer, int64_t which) {
  return layer.norms[which].has_value() ? norm(x, layer, which) : x;
}

// FusedDecoder._qk_norm: q and k of qkv [T, (H + 2 H_kv) D] normed, per head or over all heads.
at::Tensor qk_norm(const at::Tensor& qkv, const Layer& layer, int64_t heads, int64_t kv_heads) {
  int64_t head = qkv.size(1) / (heads + 2 * kv_heads);
  auto parts = qkv.split_with_sizes({heads * head, kv_heads * head, kv_heads * head}, -1);
  at::Tensor q = parts[0], k = parts[1];
  if (layer.flags[1]) {
    q = norm(q.reshape({-1, heads, head}), layer, 4).flatten(1);
    k = norm(k.reshape({-1, kv_heads, head}), layer, 5).flatten(1);
  } else {
    q = norm(q, layer, 4), k = norm(k, layer, 5);
  }
  return at::cat({q, k, parts[2]}, -1);
}

at::Tensor act_mul(const at::Tensor& gate_up, int64_t activation) {
  if (activation == kSiluMul) return cbp::silu_mul_bf16(gate_up);
  int64_t width = gate_up.size(1) / 2;
  at::Tensor gate = gate_up.narrow(1, 0, width), up = gate_up.narrow(1, width, width);
  return at::mul(activation == kSilu ? at::silu(gate) : at::gelu(gate, "tanh"), up);
}

// FusedDecoder._residual: x + post(gemv(y)) * multiplier, or gemv(y) + x in the kernel's store.
at::Tensor residual(const at::Tensor& y, const at::Tensor& packed, int64_t width,
                    const at::Tensor& x, const Layer& layer, int64_t post) {
  double multiplier = layer.numbers[7];
  if (!layer.norms[post].has_value() && multiplier == 1.0) {
    return cbp::gemv_linear(y, packed, width, x);
  }
  at::Tensor out = maybe_norm(cbp::gemv_linear(y, packed, width, {}), layer, post);
  return at::add(x, multiplier == 1.0 ? out : at::mul(out, multiplier));
}

void check_lists(int64_t layers, int64_t ropes, int64_t norms, int64_t biases, int64_t packed,
                 int64_t widths, int64_t values, int64_t flags, int64_t numbers) {
  TORCH_CHECK(ropes == layers && norms == kNorms * layers && biases == layers &&
                  packed == 4 * layers && widths == 4 && values == layers &&
                  flags == kFlags * layers && numbers == kNumbers * layers,
              "cos and signed_sin: 1 per layer, norms: 6 per layer, biases: 1 per layer, "
              "packed: 4 per layer, widths: 4, one key and value cache per layer, flags: 4 per "
              "layer, numbers: 9 per layer");
}

// x [T, d]; cos, signed_sin: L, each [T, R] (R <= D rotated dims; a NoPE layer's: ones and
// zeros [T, D]); norms: 6 L, None
// where a layer has no such norm; biases: L, qkv's or None; packed: 4 L (qkv, o, gate_up, down)
// in gemv's layout; widths: the four linears' output sizes; k_caches, v_caches: L, each
// [H_kv, N, S, D]; block_tables: L, each [B, M] (a layer's KV cache group's); flags and
// numbers: as kFlags and kNumbers say.
at::Tensor decoder_layers(const at::Tensor& x_in, at::TensorList cos, at::TensorList signed_sin,
                          const c10::List<std::optional<at::Tensor>>& norm_list,
                          const c10::List<std::optional<at::Tensor>>& bias_list,
                          at::TensorList packed, at::IntArrayRef widths,
                          at::TensorList k_caches, at::TensorList v_caches,
                          at::TensorList block_tables, const at::Tensor& slots,
                          const at::Tensor& positions, int64_t heads, at::IntArrayRef flags,
                          at::ArrayRef<double> numbers) {
  int64_t layers = static_cast<int64_t>(k_caches.size());
  TORCH_CHECK(x_in.dim() == 2 && x_in.is_contiguous(), "x: [T, d], contiguous");
  TORCH_CHECK(signed_sin.size() == cos.size(), "one cos and one signed_sin per layer");
  check_lists(layers, cos.size(), norm_list.size(), bias_list.size(), packed.size(),
              widths.size(), v_caches.size(), flags.size(), numbers.size());
  TORCH_CHECK(static_cast<int64_t>(block_tables.size()) == layers, "one block table per layer");
  std::vector<std::optional<at::Tensor>> norms(norm_list.begin(), norm_list.end());
  int64_t kv_heads = k_caches[0].size(0);
  at::Tensor x = x_in;
  for (int64_t i = 0; i < layers; ++i) {
    Layer layer{norms.data() + kNorms * i, flags.data() + kFlags * i,
                numbers.data() + kNumbers * i};
    at::Tensor qkv = cbp::gemv_linear(maybe_norm(x, layer, 0), packed[4 * i], widths[0], {});
    std::optional<at::Tensor> bias = bias_list.get(i);
    if (bias.has_value()) qkv = at::add(qkv, *bias);
    if (layer.norms[4].has_value()) qkv = qk_norm(qkv, layer, heads, kv_heads);
    at::Tensor attention = cbp::decode_step_attention(
        qkv, cos[i], signed_sin[i], k_caches[i], v_caches[i], block_tables[i], slots, positions,
        heads, layer.numbers[6], layer.flags[3], layer.numbers[8]);
    x = residual(attention, packed[4 * i + 1], widths[1], x, layer, 1);
    at::Tensor gate_up =
        cbp::gemv_linear(maybe_norm(x, layer, 2), packed[4 * i + 2], widths[2], {});
    x = residual(act_mul(gate_up, layer.flags[2]), packed[4 * i + 3], widths[3], x, layer, 3);
  }
  return x;
}

}  // namespace

TORCH_LIBRARY(cbp_step, m) {
  m.def(
      "decoder_layers(Tensor x, Tensor[] cos, Tensor[] signed_sin, Tensor?[] norms, "
      "Tensor?[] biases, Tensor[] packed, int[] widths, Tensor(a!)[] k_caches, "
      "Tensor(b!)[] v_caches, Tensor[] block_tables, Tensor slots, Tensor positions, int heads, "
      "int[] flags, float[] numbers) -> Tensor");
}

TORCH_LIBRARY_IMPL(cbp_step, CPU, m) { m.impl("decoder_layers", decoder_layers); }
