// decoder_layers: every decoder layer of a decode step in one op, the kernels called back to back.
//
// A decode step of a 30-layer model on a few rows spends about as long in Python and torch's
// dispatcher between its ops (views, reshapes, wrappers: some 1,700 ops a step) as its kernels
// take to read the weights. This op runs the fused layers' own sequence of kernels from C++,
// per layer:
//
//     h   = rms_norm(x, input_norm)                 // torch.rms_norm (float32) or cbp_layer's
//     qkv = gemv(h, [Wq; Wk; Wv])                    // [T, (H + 2 H_kv) D]
//     a   = decode_step(qkv, cos, sin', K, V, ...)   // rotary, KV write, attention: [T, H D]
//     x   = gemv(a, Wo) + x                          // residual added in the kernel's store
//     h   = rms_norm(x, post_norm)
//     gu  = gemv(h, [Wg; Wu])                        // [T, 2 I]
//     x   = gemv(silu(g) * u, Wd) + x
//
// with the same functions the torch ops run, on the same inputs, so the bits are those of the
// Python loop in engine/kernels/fused_layers.py. vLLM and SGLang reach the same end on the CPU
// by compiling the model (vllm/compilation/backends.py; sglang's cpu_graph_runner.py, "reducing
// python overhead on CPU"); here the step's shape never changes, so a loop in C++ serves.
#include <ATen/core/Tensor.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/rms_norm.h>
#include <ATen/ops/silu.h>
#include <torch/library.h>

#include "ops.h"

#include <vector>

namespace {

at::Tensor norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (x.scalar_type() == at::kBFloat16) return cbp::rms_norm_bf16(x, weight, eps);
  return at::rms_norm(x, {x.size(1)}, weight, eps);
}

at::Tensor silu_mul(const at::Tensor& gate_up) {
  if (gate_up.scalar_type() == at::kBFloat16) return cbp::silu_mul_bf16(gate_up);
  int64_t width = gate_up.size(1) / 2;
  return at::mul(at::silu(gate_up.narrow(1, 0, width)), gate_up.narrow(1, width, width));
}

// x [T, d]; norms: 2 L (input, post); packed: 4 L (qkv, o, gate_up, down) in gemv's layout;
// widths: the four linears' output sizes; k_caches, v_caches: L, each [H_kv, N, S, D].
at::Tensor decoder_layers(const at::Tensor& x_in, const at::Tensor& cos,
                          const at::Tensor& signed_sin, at::TensorList norms,
                          at::TensorList packed, at::IntArrayRef widths,
                          at::TensorList k_caches, at::TensorList v_caches,
                          const at::Tensor& block_table, const at::Tensor& slots,
                          const at::Tensor& positions, int64_t heads, double scale, double eps) {
  int64_t layers = static_cast<int64_t>(k_caches.size());
  TORCH_CHECK(x_in.dim() == 2 && x_in.is_contiguous(), "x: [T, d], contiguous");
  TORCH_CHECK(static_cast<int64_t>(norms.size()) == 2 * layers &&
                  static_cast<int64_t>(packed.size()) == 4 * layers &&
                  static_cast<int64_t>(v_caches.size()) == layers && widths.size() == 4,
              "norms: 2 per layer, packed: 4 per layer, one key and value cache per layer, "
              "widths: 4");
  at::Tensor x = x_in;
  for (int64_t i = 0; i < layers; ++i) {
    at::Tensor qkv = cbp::gemv_linear(norm(x, norms[2 * i], eps), packed[4 * i], widths[0], {});
    at::Tensor attention = cbp::decode_step_attention(qkv, cos, signed_sin, k_caches[i],
                                                      v_caches[i], block_table, slots, positions,
                                                      heads, scale);
    x = cbp::gemv_linear(attention, packed[4 * i + 1], widths[1], x);
    at::Tensor gate_up = cbp::gemv_linear(norm(x, norms[2 * i + 1], eps), packed[4 * i + 2],
                                          widths[2], {});
    x = cbp::gemv_linear(silu_mul(gate_up), packed[4 * i + 3], widths[3], x);
  }
  return x;
}

}  // namespace

TORCH_LIBRARY(cbp_step, m) {
  m.def(
      "decoder_layers(Tensor x, Tensor cos, Tensor signed_sin, Tensor[] norms, Tensor[] packed, "
      "int[] widths, Tensor(a!)[] k_caches, Tensor(b!)[] v_caches, Tensor block_table, "
      "Tensor slots, Tensor positions, int heads, float scale, float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(cbp_step, CPU, m) { m.impl("decoder_layers", decoder_layers); }
