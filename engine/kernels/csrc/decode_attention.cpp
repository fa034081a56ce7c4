// decode_attention: each sequence's one query token over its own first kv_len keys.
//
// A decode step's attention is tiny (SmolLM2-135M, 3 sequences of 200 tokens: 27 query rows by
// 200 keys of 64 values a layer), and torch's CPU flash attention spends most of a call setting
// up its blocks and buffers (65 to 85 us a call, 30 calls a step). Here one call does it
// directly, for every sequence (slot) b and key/value head h at once:
//
//     q[b, h, g, :]   g < G query heads sharing key/value head h (grouped-query attention)
//     k[b, h, t, :], v[b, h, t, :]   t < kv_len[b]; kv_len[b] = 0: the output row is zeros
//     out[b, h, g, :] = softmax_t(scale * q . k[t]) @ v
//
// in float32 whatever the input's dtype (bfloat16 widened; the result rounded to nearest even),
// with the softmax's maximum subtracted first, as SDPA does. The key/value rows may be any
// strided view (a slot cache's, a paged cache's gather) whose last dimension is contiguous.
// exp is Cephes' single-precision polynomial (simd.h's exp_ps), within 2 ulp of expf.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <torch/library.h>

#include "simd.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

constexpr int64_t kMaxChunks = 16;   // head size up to 256
constexpr int64_t kMaxGroup = 16;    // query heads per key/value head
constexpr int64_t kWorkGrain = 8192; // key rows x query heads per thread at least

using cbp::exp_ps;
using cbp::kLanes;
using cbp::lane_mask;
using cbp::load;
using cbp::store;

struct Views {  // element strides of q, k, v and out, over (b, h, t or g); the last is 1
  int64_t q[3], k[3], v[3], out[3];
};

// Scores of G queries against len keys: scores[g * len + t] = scale * q[g] . k[t].
template <typename T>
void score(const T* q, const T* k, const Views& s, int64_t group, int64_t len, int64_t head,
           float scale, float* scores) {
  int64_t chunks = (head + kLanes - 1) / kLanes;
  __m512 qv[kMaxGroup][kMaxChunks];
  for (int64_t g = 0; g < group; ++g) {
    for (int64_t c = 0; c < chunks; ++c) {
      qv[g][c] = load(q + g * s.q[2] + c * kLanes, lane_mask(c * kLanes, head));
    }
  }
  for (int64_t t = 0; t < len; ++t) {
    const T* row = k + t * s.k[2];
    __m512 kv[kMaxChunks];
    for (int64_t c = 0; c < chunks; ++c) kv[c] = load(row + c * kLanes, lane_mask(c * kLanes, head));
    for (int64_t g = 0; g < group; ++g) {
      __m512 acc = _mm512_mul_ps(qv[g][0], kv[0]);
      for (int64_t c = 1; c < chunks; ++c) acc = _mm512_fmadd_ps(qv[g][c], kv[c], acc);
      scores[g * len + t] = _mm512_reduce_add_ps(acc) * scale;
    }
  }
}

// Each query's scores in place as exp(score - max); returns nothing, sums into sums[g].
void softmax_numerators(float* scores, int64_t group, int64_t len, float* sums) {
  for (int64_t g = 0; g < group; ++g) {
    float* row = scores + g * len;
    float top = *std::max_element(row, row + len);
    __m512 shift = _mm512_set1_ps(top), total = _mm512_setzero_ps();
    for (int64_t t = 0; t < len; t += kLanes) {
      __mmask16 m = lane_mask(t, len);
      __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + t), shift));
      _mm512_mask_storeu_ps(row + t, m, e);
      total = _mm512_add_ps(total, _mm512_maskz_mov_ps(m, e));
    }
    sums[g] = _mm512_reduce_add_ps(total);
  }
}

// out[g] = sum_t weights[g * len + t] v[t] / sums[g].
template <typename T>
void weigh(const float* weights, const float* sums, const T* v, const Views& s, int64_t group,
           int64_t len, int64_t head, T* out) {
  int64_t chunks = (head + kLanes - 1) / kLanes;
  __m512 acc[kMaxGroup][kMaxChunks];
  for (int64_t g = 0; g < group; ++g) {
    for (int64_t c = 0; c < chunks; ++c) acc[g][c] = _mm512_setzero_ps();
  }
  for (int64_t t = 0; t < len; ++t) {
    const T* row = v + t * s.v[2];
    __m512 vv[kMaxChunks];
    for (int64_t c = 0; c < chunks; ++c) vv[c] = load(row + c * kLanes, lane_mask(c * kLanes, head));
    for (int64_t g = 0; g < group; ++g) {
      __m512 w = _mm512_set1_ps(weights[g * len + t]);
      for (int64_t c = 0; c < chunks; ++c) acc[g][c] = _mm512_fmadd_ps(w, vv[c], acc[g][c]);
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    __m512 inv = _mm512_set1_ps(len > 0 ? 1.0f / sums[g] : 0.0f);
    for (int64_t c = 0; c < chunks; ++c) {
      store(out + g * s.out[2] + c * kLanes, _mm512_mul_ps(acc[g][c], inv),
            lane_mask(c * kLanes, head));
    }
  }
}

template <typename T>
void run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const int64_t* lens,
         double scale, at::Tensor& out) {
  int64_t slots = q.size(0), heads = q.size(1), group = q.size(2), head = q.size(3);
  Views s{};
  for (int i = 0; i < 3; ++i) {
    s.q[i] = q.stride(i), s.k[i] = k.stride(i), s.v[i] = v.stride(i), s.out[i] = out.stride(i);
  }
  const T *qp = q.data_ptr<T>(), *kp = k.data_ptr<T>(), *vp = v.data_ptr<T>();
  T* op = out.data_ptr<T>();
  int64_t longest = *std::max_element(lens, lens + slots);
  int64_t grain = std::max<int64_t>(1, kWorkGrain / std::max<int64_t>(1, longest * group));
  at::parallel_for(0, slots * heads, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(group * std::max<int64_t>(longest, 1));
    float sums[kMaxGroup];
    for (int64_t task = begin; task < end; ++task) {
      int64_t b = task / heads, h = task % heads, len = lens[b];
      const T* qb = qp + b * s.q[0] + h * s.q[1];
      const T* kb = kp + b * s.k[0] + h * s.k[1];
      const T* vb = vp + b * s.v[0] + h * s.v[1];
      score(qb, kb, s, group, len, head, static_cast<float>(scale), scores.data());
      softmax_numerators(scores.data(), group, len, sums);
      weigh(scores.data(), sums, vb, s, group, len, head, op + b * s.out[0] + h * s.out[1]);
    }
  });
}

at::Tensor decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& kv_lens, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v: [B, H_kv, G or T, D]");
  TORCH_CHECK(q.size(0) == k.size(0) && k.sizes() == v.sizes() && q.size(1) == k.size(1) &&
                  q.size(3) == k.size(3),
              "q [B, H_kv, G, D] and k, v [B, H_kv, T, D] must agree");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(),
              "q, k and v must share one dtype");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1,
              "each head's values must be contiguous");
  TORCH_CHECK(q.size(3) <= kLanes * kMaxChunks && q.size(2) <= kMaxGroup,
              "head size up to 256 and up to 16 query heads per key/value head");
  auto lens = kv_lens.to(at::kLong).contiguous();
  TORCH_CHECK(lens.dim() == 1 && lens.size(0) == q.size(0), "kv_lens: [B]");
  const int64_t* lp = lens.data_ptr<int64_t>();
  for (int64_t b = 0; b < lens.size(0); ++b) {
    TORCH_CHECK(lp[b] >= 0 && lp[b] <= k.size(2), "kv_lens must lie within the keys given");
  }
  auto out = at::empty(q.sizes(), q.options());
  if (q.scalar_type() == at::kFloat) run<float>(q, k, v, lp, scale, out);
  else if (q.scalar_type() == at::kBFloat16) run<c10::BFloat16>(q, k, v, lp, scale, out);
  else TORCH_CHECK(false, "decode attention takes float32 or bfloat16");
  return out;
}

// x * cos + swap(x) * signed_sin on one head's row, swap exchanging the row's two halves (the
// fused layers' folded rotary), rounded to T after each multiply and the add, as torch's three
// ops are (no fused multiply-add: the build passes -ffp-contract=off).
template <typename T>
inline T rotated(const T* x, const T* cos, const T* signed_sin, int64_t d, int64_t head) {
  int64_t half = head / 2, other = d < half ? d + half : d - half;
  T a = static_cast<T>(static_cast<float>(x[d]) * static_cast<float>(cos[d]));
  T b = static_cast<T>(static_cast<float>(x[other]) * static_cast<float>(signed_sin[d]));
  return static_cast<T>(static_cast<float>(a) + static_cast<float>(b));
}

struct StepShape {
  int64_t heads, kv_heads, head, qkv_stride, rope_stride, cache[3];  // cache: b, h, t strides
};

// One (token, key/value head) of a decode step: rotary on its key and its G queries, the key and
// value into the cache at (slot, position), then the G queries over the slot's position + 1 keys.
template <typename T>
void step_task(const T* qkv, const T* cos, const T* sin, T* kc, T* vc, int64_t slot,
               int64_t position, int64_t h, const StepShape& z, float scale, T* out,
               std::vector<float>& scores) {
  int64_t group = z.heads / z.kv_heads, head = z.head;
  const T* key = qkv + (z.heads + h) * head;
  const T* value = qkv + (z.heads + z.kv_heads + h) * head;
  int64_t row = slot * z.cache[0] + h * z.cache[1];
  T* key_slot = kc + row + position * z.cache[2];
  T* value_slot = vc + row + position * z.cache[2];
  for (int64_t d = 0; d < head; ++d) {
    key_slot[d] = rotated(key, cos, sin, d, head);
    value_slot[d] = value[d];
  }
  T queries[kMaxGroup * kLanes * kMaxChunks];
  for (int64_t g = 0; g < group; ++g) {
    const T* query = qkv + (h * group + g) * head;
    for (int64_t d = 0; d < head; ++d) queries[g * head + d] = rotated(query, cos, sin, d, head);
  }
  Views s{};
  s.q[2] = head, s.k[2] = z.cache[2], s.v[2] = z.cache[2], s.out[2] = head;
  int64_t len = position + 1;
  float sums[kMaxGroup];
  scores.resize(group * len);
  score(queries, kc + row, s, group, len, head, scale, scores.data());
  softmax_numerators(scores.data(), group, len, sums);
  weigh(scores.data(), sums, vc + row, s, group, len, head, out + h * group * head);
}

template <typename T>
void run_step(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
              at::Tensor& kc, at::Tensor& vc, const int64_t* slots, const int64_t* positions,
              const StepShape& z, double scale, at::Tensor& out) {
  int64_t tokens = qkv.size(0), kv_heads = z.kv_heads;
  const T *qp = qkv.data_ptr<T>(), *cp = cos.data_ptr<T>(), *sp = sin.data_ptr<T>();
  T *kp = kc.data_ptr<T>(), *vp = vc.data_ptr<T>(), *op = out.data_ptr<T>();
  int64_t longest = *std::max_element(positions, positions + tokens) + 1;
  int64_t group = z.heads / kv_heads;
  int64_t grain = std::max<int64_t>(1, kWorkGrain / std::max<int64_t>(1, longest * group));
  at::parallel_for(0, tokens * kv_heads, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t task = begin; task < end; ++task) {
      int64_t t = task / kv_heads, h = task % kv_heads;
      step_task(qp + t * z.qkv_stride, cp + t * z.rope_stride, sp + t * z.rope_stride, kp, vp,
                slots[t], positions[t], h, z, static_cast<float>(scale),
                op + t * z.heads * z.head, scores);
    }
  });
}

at::Tensor decode_step(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& signed_sin,
                       at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& slots,
                       const at::Tensor& positions, int64_t heads, double scale) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.stride(1) == 1, "qkv: [T, (H + 2 H_kv) D], rows contiguous");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() &&
                  k_cache.strides() == v_cache.strides() && k_cache.stride(3) == 1,
              "k_cache, v_cache: [B, H_kv, P, D], alike, each head's values contiguous");
  int64_t tokens = qkv.size(0), kv_heads = k_cache.size(1), head = k_cache.size(3);
  TORCH_CHECK(heads > 0 && heads % kv_heads == 0 && heads / kv_heads <= kMaxGroup &&
                  head % 2 == 0 && head <= kLanes * kMaxChunks,
              "heads must be a multiple of H_kv, up to 16 times it; an even head size up to 256");
  TORCH_CHECK(qkv.size(1) == (heads + 2 * kv_heads) * head, "qkv's width must be (H + 2 H_kv) D");
  TORCH_CHECK(cos.dim() == 2 && cos.sizes() == signed_sin.sizes() && cos.size(0) == tokens &&
                  cos.size(1) == head && cos.stride(1) == 1 &&
                  cos.strides() == signed_sin.strides(),
              "cos, signed_sin: [T, D], alike, rows contiguous");
  for (auto type : {cos.scalar_type(), signed_sin.scalar_type(), k_cache.scalar_type(),
                    v_cache.scalar_type()}) {
    TORCH_CHECK(type == qkv.scalar_type(), "qkv, rotary and caches share one dtype");
  }
  auto slot_ids = slots.to(at::kLong).contiguous(), pos = positions.to(at::kLong).contiguous();
  TORCH_CHECK(slot_ids.numel() == tokens && pos.numel() == tokens, "slots, positions: [T]");
  const int64_t *sp = slot_ids.data_ptr<int64_t>(), *pp = pos.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(sp[t] >= 0 && sp[t] < k_cache.size(0) && pp[t] >= 0 && pp[t] < k_cache.size(2),
                "each token's slot and position must lie within the cache");
    for (int64_t u = 0; u < t; ++u) TORCH_CHECK(sp[u] != sp[t], "one token per slot");
  }
  StepShape z{heads, kv_heads, head, qkv.stride(0), cos.stride(0),
              {k_cache.stride(0), k_cache.stride(1), k_cache.stride(2)}};
  auto out = at::empty({tokens, heads * head}, qkv.options());
  if (qkv.scalar_type() == at::kFloat) {
    run_step<float>(qkv, cos, signed_sin, k_cache, v_cache, sp, pp, z, scale, out);
  } else if (qkv.scalar_type() == at::kBFloat16) {
    run_step<c10::BFloat16>(qkv, cos, signed_sin, k_cache, v_cache, sp, pp, z, scale, out);
  } else {
    TORCH_CHECK(false, "decode attention takes float32 or bfloat16");
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(cbp_attention, m) {
  m.def("decode(Tensor q, Tensor k, Tensor v, Tensor kv_lens, float scale) -> Tensor");
  m.def(
      "decode_step(Tensor qkv, Tensor cos, Tensor signed_sin, Tensor(a!) k_cache, "
      "Tensor(b!) v_cache, Tensor slots, Tensor positions, int heads, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(cbp_attention, CPU, m) {
  m.impl("decode", decode);
  m.impl("decode_step", decode_step);
}
