// layer_ops: a bfloat16 decoder layer's RMSNorm and SiLU-and-mul, one call each.
//
// In bfloat16, transformers' LlamaRMSNorm is a cast to float32, torch's RMSNorm (pow, mean, add,
// rsqrt, mul), a cast back and a multiply by the weight: about ten ops a call, 61 calls a decode
// step of SmolLM2-135M; SiLU-and-mul is two more a layer. At a decode step's few rows each op
// is microseconds of dispatch around well under one of arithmetic. Here each is one call that
// computes what transformers computes, in float32 with the same roundings to bfloat16:
//
//     rms_norm(x[T, d], w[d]):  h = float(x[t]);  r = 1 / sqrt(sum(h * h) / d + eps)
//                               out[t] = bf16( float(w) * float(bf16(h * r)) )
//     silu_mul(gate_up[T, 2I]): g, u = gate_up[t, :I], gate_up[t, I:]
//                               out[t] = bf16( float(bf16(g / (1 + exp(-g)))) * float(u) )
//
// The sum of squares runs in another order than torch's and exp is Cephes' (simd.h), so a
// result may differ from torch's ops in its last bit now and then: float32 steps keep torch's
// own ops, whose bits equal transformers' modules.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <torch/library.h>

#include <cmath>

#include "ops.h"
#include "simd.h"

namespace {

using cbp::kLanes;
using cbp::lane_mask;
using cbp::load;
using cbp::store;
using bf16 = c10::BFloat16;

constexpr int64_t kGrain = 16384;  // values per thread at least

int64_t row_grain(int64_t width) { return std::max<int64_t>(1, kGrain / std::max<int64_t>(1, width)); }

void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() == 2, name, ": [T, width]");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16, name, " must be bfloat16");
  TORCH_CHECK(x.stride(1) == 1, name, "'s rows must be contiguous");
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, "x");
  int64_t rows = x.size(0), width = x.size(1);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == width && weight.is_contiguous() &&
                  weight.scalar_type() == at::kBFloat16,
              "weight: a contiguous bfloat16 [d] for x [T, d]");
  auto out = at::empty({rows, width}, x.options());
  const bf16 *xp = x.data_ptr<bf16>(), *wp = weight.data_ptr<bf16>();
  bf16* op = out.data_ptr<bf16>();
  int64_t x_stride = x.stride(0);
  float epsilon = static_cast<float>(eps);
  at::parallel_for(0, rows, row_grain(width), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const bf16* row = xp + t * x_stride;
      __m512 squares = _mm512_setzero_ps();
      for (int64_t i = 0; i < width; i += kLanes) {
        __m512 h = load(row + i, lane_mask(i, width));
        squares = _mm512_fmadd_ps(h, h, squares);
      }
      float mean = _mm512_reduce_add_ps(squares) / static_cast<float>(width);
      __m512 scale = _mm512_set1_ps(1.0f / std::sqrt(mean + epsilon));
      for (int64_t i = 0; i < width; i += kLanes) {
        __mmask16 m = lane_mask(i, width);
        __m512 normed = cbp::round_bf16(_mm512_mul_ps(load(row + i, m), scale));
        store(op + t * width + i, _mm512_mul_ps(load(wp + i, m), normed), m);
      }
    }
  });
  return out;
}

at::Tensor silu_mul(const at::Tensor& gate_up) {
  check_rows(gate_up, "gate_up");
  TORCH_CHECK(gate_up.size(1) % 2 == 0, "gate_up: [T, 2 I]");
  int64_t rows = gate_up.size(0), width = gate_up.size(1) / 2;
  auto out = at::empty({rows, width}, gate_up.options());
  const bf16* gp = gate_up.data_ptr<bf16>();
  bf16* op = out.data_ptr<bf16>();
  int64_t stride = gate_up.stride(0);
  const __m512 one = _mm512_set1_ps(1.0f);
  at::parallel_for(0, rows, row_grain(width), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const bf16 *gate = gp + t * stride, *up = gate + width;
      for (int64_t i = 0; i < width; i += kLanes) {
        __mmask16 m = lane_mask(i, width);
        __m512 g = load(gate + i, m);
        __m512 denominator = _mm512_add_ps(one, cbp::exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g)));
        __m512 silu = cbp::round_bf16(_mm512_div_ps(g, denominator));
        store(op + t * width + i, _mm512_mul_ps(silu, load(up + i, m)), m);
      }
    }
  });
  return out;
}

}  // namespace

namespace cbp {
at::Tensor rms_norm_bf16(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return rms_norm(x, weight, eps);
}
at::Tensor silu_mul_bf16(const at::Tensor& gate_up) { return silu_mul(gate_up); }
}  // namespace cbp

TORCH_LIBRARY(cbp_layer, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
}

TORCH_LIBRARY_IMPL(cbp_layer, CPU, m) {
  m.impl("rms_norm", rms_norm);
  m.impl("silu_mul", silu_mul);
}
