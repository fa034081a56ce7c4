// ops.h: the entry points of this project's kernels, callable from C++ without the dispatcher,
// so that decoder_layers.cpp runs a decode step's layers back to back in one op. Each is the
// function its torch op runs (the same checks, the same bits).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace cbp {

// gemv.cpp, torch.ops.cbp_gemv.linear: y [M, n] = x [M, K] @ W^T (+ residual [M, n]).
at::Tensor gemv_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n,
                       const std::optional<at::Tensor>& residual);

// decode_attention.cpp, torch.ops.cbp_attention.decode_step: one layer's rotary, KV write and
// attention on a decode step; qkv [T, (H + 2 H_kv) D] -> [T, H D]; cos, signed_sin [T, R], the
// first R <= D dims rotated; window: keys a query sees (0: all before it); softcap: the scores'
// cap c tanh(s / c) (0: none).
at::Tensor decode_step_attention(const at::Tensor& qkv, const at::Tensor& cos,
                                 const at::Tensor& signed_sin, at::Tensor k_cache,
                                 at::Tensor v_cache, const at::Tensor& block_table,
                                 const at::Tensor& slots, const at::Tensor& positions,
                                 int64_t heads, double scale, int64_t window, double softcap);

// layer_ops.cpp, torch.ops.cbp_layer: bfloat16 RMSNorm [T, d] and SiLU-and-mul [T, 2 I] -> [T, I].
at::Tensor rms_norm_bf16(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor silu_mul_bf16(const at::Tensor& gate_up);

}  // namespace cbp
