// gemv: y[M, N] = x[M, K] @ W[N, K]^T (+ residual) for a few rows M, streaming W once.
//
// A decode step multiplies each weight by one row per sequence, so its time is the time to read
// the weight from memory. The weight is packed once into blocks of 16 outputs,
//
//     packed[b, k, j] = W[16 b + j, k]        shape [ceil(N / 16), K, 16], zero-padded,
//
// so that one pass reads it front to back in one stream per block: at each k, one 64-byte load
// (float32; 32 bytes of bfloat16, widened) feeds one fused multiply-add per row, broadcasting
// x[m, k]. On a CPU with AVX512-BF16, a bfloat16 weight is packed by pairs of k instead,
//
//     packed[b, i, j, t] = W[16 b + j, 2 i + t]   shape [ceil(N / 16), ceil(K / 2), 16, 2],
//
// and one VDPBF16PS per row and 64-byte load takes two k at once (x rounded to bfloat16 first,
// as a bfloat16 matmul's input is already). Up to four blocks run side by side (one accumulator
// of 16 float32 lanes per block and row, no horizontal sums). Rows go in groups of at most 8 (each group reads the weight once more); the threads of
// torch's pool (at::parallel_for) share the blocks. Sums are float32, in k order, as a GEMM
// micro-kernel's; a bfloat16 result is rounded to nearest even, then the residual is added (in
// float32, rounded again), as a bfloat16 matmul followed by an add does.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <torch/library.h>

#include "ops.h"
#include "simd.h"

#include <algorithm>
#include <optional>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kBlock = 16;    // outputs per packed block: one register of float32 lanes
constexpr int64_t kMaxGroup = 8;  // rows per pass over the weight
constexpr int64_t kAhead = 32;    // k steps prefetched ahead in a block's stream
constexpr int64_t kGrain = 8;     // blocks per thread at least

// Blocks read side by side: one stream for one or two rows, four for three or four rows, two
// for more (fewer streams prefetch better; more rows need more independent sums to keep the
// multiply-adds busy, within the 32 vector registers).
constexpr int blocks_side_by_side(int rows) { return rows <= 2 ? 1 : rows <= 4 ? 4 : 2; }
// The pairs layout (bfloat16, VDPBF16PS) keeps four streams up to eight rows.
constexpr int pair_blocks_side_by_side(int rows) { return rows <= 2 ? 1 : 4; }

inline __m512 widen(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 widen(const c10::BFloat16* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

using cbp::round_bf16;

template <typename T>
struct Out {
  T* y;                // [M, N]
  const T* residual;   // [M, N] or null
  int64_t N;
};

inline void store(Out<float> o, int64_t m, int64_t n0, __mmask16 mask, __m512 acc) {
  if (o.residual) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(mask, o.residual + m * o.N + n0));
  _mm512_mask_storeu_ps(o.y + m * o.N + n0, mask, acc);
}

inline void store(Out<c10::BFloat16> o, int64_t m, int64_t n0, __mmask16 mask, __m512 acc) {
  acc = round_bf16(acc);
  if (o.residual) {
    __m256i r = _mm256_maskz_loadu_epi16(mask, o.residual + m * o.N + n0);
    __m512 rv = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(r), 16));
    acc = round_bf16(_mm512_add_ps(acc, rv));
  }
  __m256i h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(acc), 16));
  _mm256_mask_storeu_epi16(o.y + m * o.N + n0, mask, h);
}

// The sums of blocks b .. b + B - 1, rows 0 .. M - 1, stored (the last block may be partial).
template <int M, int B, typename T>
inline void store_blocks(__m512 (&acc)[B][M], int64_t b, Out<T> o) {
  for (int j = 0; j < B; ++j) {
    int64_t n0 = (b + j) * kBlock, left = std::min<int64_t>(kBlock, o.N - n0);
    __mmask16 mask = left >= kBlock ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    for (int m = 0; m < M; ++m) store(o, m, n0, mask, acc[j][m]);
  }
}

// Blocks b .. b + B - 1 for rows 0 .. M - 1 of x (float32 [M, K]).
template <int M, int B, typename W, typename T>
inline void blocks(const float* x, const W* packed, int64_t K, int64_t b, Out<T> o) {
  __m512 acc[B][M];
  const W* w[B];
  for (int j = 0; j < B; ++j) {
    w[j] = packed + (b + j) * K * kBlock;
    for (int m = 0; m < M; ++m) acc[j][m] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < K; ++k) {
    __m512 wv[B];
    for (int j = 0; j < B; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(w[j] + (k + kAhead) * kBlock), _MM_HINT_T0);
      wv[j] = widen(w[j] + k * kBlock);
    }
    for (int m = 0; m < M; ++m) {
      __m512 xb = _mm512_set1_ps(x[m * K + k]);
      for (int j = 0; j < B; ++j) acc[j][m] = _mm512_fmadd_ps(xb, wv[j], acc[j][m]);
    }
  }
  store_blocks<M, B>(acc, b, o);
}

// The pairs layout: blocks b .. b + B - 1, x as bfloat16 pairs [M, K2] (K2 = ceil(K / 2)).
template <int M, int B, typename T>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) inline void pair_blocks(
    const int32_t* x, const c10::BFloat16* packed, int64_t K2, int64_t b, Out<T> o) {
  __m512 acc[B][M];
  const c10::BFloat16* w[B];
  for (int j = 0; j < B; ++j) {
    w[j] = packed + (b + j) * K2 * 2 * kBlock;
    for (int m = 0; m < M; ++m) acc[j][m] = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < K2; ++i) {
    __m512bh wv[B];
    for (int j = 0; j < B; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(w[j] + (i + kAhead) * 2 * kBlock), _MM_HINT_T0);
      wv[j] = (__m512bh)_mm512_loadu_si512(w[j] + i * 2 * kBlock);
    }
    for (int m = 0; m < M; ++m) {
      __m512bh xb = (__m512bh)_mm512_set1_epi32(x[m * K2 + i]);
      for (int j = 0; j < B; ++j) acc[j][m] = _mm512_dpbf16_ps(acc[j][m], xb, wv[j]);
    }
  }
  store_blocks<M, B>(acc, b, o);
}

// f(std::integral_constant<int, M>{}) for a row count of 1 to 8: M a compile-time constant.
template <typename F>
void by_rows(int64_t M, F&& f) {
  switch (M) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    default: return f(std::integral_constant<int, 8>{});
  }
}

// The blocks of N outputs shared among torch's threads, each thread's range read B blocks side
// by side, then one by one: f(std::integral_constant<int, B or 1>{}, first block).
template <int B, typename F>
void over_blocks(int64_t N, F&& f) {
  int64_t num_blocks = (N + kBlock - 1) / kBlock;
  at::parallel_for(0, num_blocks, kGrain, [&](int64_t b0, int64_t b1) {
    int64_t b = b0;
    for (; b + B <= b1; b += B) f(std::integral_constant<int, B>{}, b);
    for (; b < b1; ++b) f(std::integral_constant<int, 1>{}, b);
  });
}

// f(rows in the group, first row, the group's output) per group of at most kMaxGroup rows.
template <typename T, typename F>
void by_groups(at::Tensor& y, const std::optional<at::Tensor>& residual, F&& f) {
  int64_t M = y.size(0), N = y.size(1);
  for (int64_t m0 = 0; m0 < M; m0 += kMaxGroup) {
    Out<T> o{y.data_ptr<T>() + m0 * N, residual ? residual->data_ptr<T>() + m0 * N : nullptr, N};
    f(std::min(kMaxGroup, M - m0), m0, o);
  }
}

template <typename W, typename T>
void run(const at::Tensor& x32, const at::Tensor& packed, at::Tensor& y,
         const std::optional<at::Tensor>& residual) {
  int64_t K = x32.size(1);
  const W* w = packed.data_ptr<W>();
  by_groups<T>(y, residual, [&](int64_t g, int64_t m0, Out<T> o) {
    const float* x = x32.data_ptr<float>() + m0 * K;
    by_rows(g, [&](auto m) {
      constexpr int M = decltype(m)::value;
      over_blocks<blocks_side_by_side(M)>(o.N, [&](auto nb, int64_t b) {
        blocks<M, decltype(nb)::value, W, T>(x, w, K, b, o);
      });
    });
  });
}

// The bfloat16 rows of x as pairs of k, [M, K2] 32-bit words: x itself when it is contiguous
// bfloat16 with an even K, else a zero-padded copy.
at::Tensor x_pairs(const at::Tensor& x, int64_t K2) {
  if (x.scalar_type() == at::kBFloat16 && x.is_contiguous() && x.size(1) == 2 * K2) return x;
  auto padded = at::zeros({x.size(0), 2 * K2}, x.options().dtype(at::kBFloat16));
  padded.narrow(1, 0, x.size(1)).copy_(x);
  return padded;
}

bool has_bf16_pairs() { return __builtin_cpu_supports("avx512bf16"); }

at::Tensor pack(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2, "gemv.pack: a weight [N, K]");
  TORCH_CHECK(weight.scalar_type() == at::kFloat || weight.scalar_type() == at::kBFloat16,
              "gemv.pack: float32 or bfloat16 weights only");
  int64_t N = weight.size(0), K = weight.size(1), num_blocks = (N + kBlock - 1) / kBlock;
  if (weight.scalar_type() == at::kBFloat16 && has_bf16_pairs()) {
    int64_t K2 = (K + 1) / 2;
    auto padded = at::zeros({num_blocks * kBlock, 2 * K2}, weight.options());
    padded.narrow(0, 0, N).narrow(1, 0, K).copy_(weight);
    return padded.view({num_blocks, kBlock, K2, 2}).permute({0, 2, 1, 3}).contiguous();
  }
  auto padded = at::zeros({num_blocks * kBlock, K}, weight.options());
  padded.narrow(0, 0, N).copy_(weight);
  return padded.view({num_blocks, kBlock, K}).transpose(1, 2).contiguous();
}

template <typename T>
void run_pairs(const at::Tensor& x, const at::Tensor& packed, at::Tensor& y,
               const std::optional<at::Tensor>& residual) {
  int64_t K2 = packed.size(1);
  auto pairs = x_pairs(x, K2);
  const int32_t* words = reinterpret_cast<const int32_t*>(pairs.data_ptr<c10::BFloat16>());
  const c10::BFloat16* w = packed.data_ptr<c10::BFloat16>();
  by_groups<T>(y, residual, [&](int64_t g, int64_t m0, Out<T> o) {
    by_rows(g, [&](auto m) {
      constexpr int M = decltype(m)::value;
      over_blocks<pair_blocks_side_by_side(M)>(o.N, [&](auto nb, int64_t b) {
        pair_blocks<M, decltype(nb)::value, T>(words + m0 * K2, w, K2, b, o);
      });
    });
  });
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, int64_t n,
                  const std::optional<at::Tensor>& residual) {
  bool pairs = packed.dim() == 4;  // bfloat16 by pairs of k (AVX512-BF16)
  TORCH_CHECK(x.dim() == 2 && (packed.dim() == 3 || pairs) && packed.size(2) == kBlock,
              "gemv.linear: shapes");
  int64_t packed_k = pairs ? 2 * packed.size(1) : packed.size(1);
  TORCH_CHECK(x.size(1) == packed_k || (pairs && x.size(1) + 1 == packed_k), "gemv.linear: K");
  TORCH_CHECK(n <= packed.size(0) * kBlock, "gemv.linear: N");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "gemv.linear: float32 or bfloat16 inputs only");
  auto y = at::empty({x.size(0), n}, x.options());
  std::optional<at::Tensor> res;
  if (residual) {
    TORCH_CHECK(residual->sizes() == y.sizes() && residual->scalar_type() == y.scalar_type(),
                "gemv.linear: the residual must be [M, N] in the input's dtype");
    res = residual->contiguous();
  }
  if (pairs) {
    if (y.scalar_type() == at::kFloat) run_pairs<float>(x, packed, y, res);
    else run_pairs<c10::BFloat16>(x, packed, y, res);
    return y;
  }
  auto x32 = x.to(at::kFloat).contiguous();
  bool w32 = packed.scalar_type() == at::kFloat, y32 = y.scalar_type() == at::kFloat;
  if (w32 && y32) run<float, float>(x32, packed, y, res);
  else if (w32) run<float, c10::BFloat16>(x32, packed, y, res);
  else if (y32) run<c10::BFloat16, float>(x32, packed, y, res);
  else run<c10::BFloat16, c10::BFloat16>(x32, packed, y, res);
  return y;
}

}  // namespace

namespace cbp {
at::Tensor gemv_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n,
                       const std::optional<at::Tensor>& residual) {
  return linear(x, packed, n, residual);
}
}  // namespace cbp

TORCH_LIBRARY(cbp_gemv, m) {
  m.def("pack(Tensor weight) -> Tensor");
  m.def("linear(Tensor x, Tensor packed, int n, Tensor? residual=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(cbp_gemv, CPU, m) {
  m.impl("pack", pack);
  m.impl("linear", linear);
}
