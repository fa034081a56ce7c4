// gemv: y[M, N] = x[M, K] @ W[N, K]^T (+ residual) for a few rows M, streaming W once.
//
// A decode step multiplies each weight by one row per sequence, so its time is the time to read
// the weight from memory. The weight is packed once into blocks of 16 outputs,
//
//     packed[b, k, j] = W[16 b + j, k]        shape [ceil(N / 16), K, 16], zero-padded,
//
// so that one pass reads it front to back in one stream per block: at each k, one 64-byte load
// (float32; 32 bytes of bfloat16, widened) feeds one fused multiply-add per row, broadcasting
// x[m, k]. Two blocks run side by side (2 x M accumulators of 16 float32 lanes, no horizontal
// sums). Rows go in groups of at most 8 (each group reads the weight once more); the threads of
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

#include <algorithm>
#include <optional>
#include <vector>

namespace {

constexpr int64_t kBlock = 16;    // outputs per packed block: one register of float32 lanes
constexpr int64_t kMaxGroup = 8;  // rows per pass over the weight
constexpr int64_t kAhead = 32;    // k steps prefetched ahead in a block's stream

inline __m512 widen(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 widen(const c10::BFloat16* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// float32 lanes rounded to bfloat16 (nearest even) and back to float32
inline __m512 round_bf16(__m512 v) {
  __m512i bits = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  bits = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  return _mm512_castsi512_ps(_mm512_and_si512(bits, _mm512_set1_epi32(0xFFFF0000)));
}

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
  for (int j = 0; j < B; ++j) {
    int64_t n0 = (b + j) * kBlock, left = std::min<int64_t>(kBlock, o.N - n0);
    __mmask16 mask = left >= kBlock ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    for (int m = 0; m < M; ++m) store(o, m, n0, mask, acc[j][m]);
  }
}

template <int M, typename W, typename T>
void group(const float* x, const W* packed, int64_t K, Out<T> o) {
  int64_t num_blocks = (o.N + kBlock - 1) / kBlock, num_pairs = (num_blocks + 1) / 2;
  at::parallel_for(0, num_pairs, 4, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      if (2 * p + 1 < num_blocks)
        blocks<M, 2, W, T>(x, packed, K, 2 * p, o);
      else
        blocks<M, 1, W, T>(x, packed, K, 2 * p, o);
    }
  });
}

template <typename W, typename T>
void rows(int64_t M, const float* x, const W* packed, int64_t K, Out<T> o) {
  switch (M) {
    case 1: return group<1, W, T>(x, packed, K, o);
    case 2: return group<2, W, T>(x, packed, K, o);
    case 3: return group<3, W, T>(x, packed, K, o);
    case 4: return group<4, W, T>(x, packed, K, o);
    case 5: return group<5, W, T>(x, packed, K, o);
    case 6: return group<6, W, T>(x, packed, K, o);
    case 7: return group<7, W, T>(x, packed, K, o);
    default: return group<8, W, T>(x, packed, K, o);
  }
}

template <typename W, typename T>
void run(const at::Tensor& x32, const at::Tensor& packed, at::Tensor& y,
         const std::optional<at::Tensor>& residual) {
  int64_t M = x32.size(0), K = x32.size(1), N = y.size(1);
  for (int64_t m0 = 0; m0 < M; m0 += kMaxGroup) {
    int64_t g = std::min(kMaxGroup, M - m0);
    Out<T> o{y.data_ptr<T>() + m0 * N,
             residual ? residual->data_ptr<T>() + m0 * N : nullptr, N};
    rows<W, T>(g, x32.data_ptr<float>() + m0 * K, packed.data_ptr<W>(), K, o);
  }
}

at::Tensor pack(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2, "gemv.pack: a weight [N, K]");
  TORCH_CHECK(weight.scalar_type() == at::kFloat || weight.scalar_type() == at::kBFloat16,
              "gemv.pack: float32 or bfloat16 weights only");
  int64_t N = weight.size(0), K = weight.size(1), num_blocks = (N + kBlock - 1) / kBlock;
  auto padded = at::zeros({num_blocks * kBlock, K}, weight.options());
  padded.narrow(0, 0, N).copy_(weight);
  return padded.view({num_blocks, kBlock, K}).transpose(1, 2).contiguous();
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, int64_t n,
                  const std::optional<at::Tensor>& residual) {
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 3 && packed.size(2) == kBlock, "gemv.linear: shapes");
  TORCH_CHECK(x.size(1) == packed.size(1) && n <= packed.size(0) * kBlock, "gemv.linear: K or N");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "gemv.linear: float32 or bfloat16 inputs only");
  auto x32 = x.to(at::kFloat).contiguous();
  auto y = at::empty({x.size(0), n}, x.options());
  std::optional<at::Tensor> res;
  if (residual) {
    TORCH_CHECK(residual->sizes() == y.sizes() && residual->scalar_type() == y.scalar_type(),
                "gemv.linear: the residual must be [M, N] in the input's dtype");
    res = residual->contiguous();
  }
  bool w32 = packed.scalar_type() == at::kFloat, y32 = y.scalar_type() == at::kFloat;
  if (w32 && y32) run<float, float>(x32, packed, y, res);
  else if (w32) run<float, c10::BFloat16>(x32, packed, y, res);
  else if (y32) run<c10::BFloat16, float>(x32, packed, y, res);
  else run<c10::BFloat16, c10::BFloat16>(x32, packed, y, res);
  return y;
}

}  // namespace

TORCH_LIBRARY(cbp_gemv, m) {
  m.def("pack(Tensor weight) -> Tensor");
  m.def("linear(Tensor x, Tensor packed, int n, Tensor? residual=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(cbp_gemv, CPU, m) {
  m.impl("pack", pack);
  m.impl("linear", linear);
}
