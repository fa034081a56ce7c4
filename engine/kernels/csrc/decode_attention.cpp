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
//
// decode_step does a step's whole attention for one layer: rotary, every new key and value into
// the cache first, then the attention above, each token's queries over its sequence's first
// position + 1 keys (so the tokens of a short prefill chunk attend causally, one query each),
// or with a sliding window of W keys (W > 0) over keys position - W + 1 to position only. With a
// soft cap c > 0 (Gemma 2's attn_logit_softcapping) each score s becomes c tanh(s / c) before the
// softmax, as transformers' eager attention computes it. Its rotary tables are [T, R]: the first
// R of each head's D dims rotate, the rest pass through (partial RoPE, Phi-3's; R = D: all). Its
// cache is blocks of S positions, [H_kv, N, S, D],
// found through a block table [B, M] as in vLLM's paged attention: slot b's position p lives in
// block block_table[b, p / S] at offset p % S. A slot cache is the case M = 1, S = P (each slot
// one block); a paged cache's table is its sequences' block tables, padded.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <torch/library.h>

#include "ops.h"
#include "simd.h"

#include <algorithm>
#include <cmath>
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

// Scores of G queries against len keys: scores[g * ld + t] = scale * q[g] . k[t].
template <typename T>
void score(const T* q, const T* k, const Views& s, int64_t group, int64_t len, int64_t head,
           float scale, float* scores, int64_t ld) {
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
      scores[g * ld + t] = _mm512_reduce_add_ps(acc) * scale;
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

using Sums = __m512[kMaxGroup][kMaxChunks];

// acc[g] += sum_t weights[g * ld + t] v[t], over len value rows v_stride apart.
template <typename T>
void accumulate(const float* weights, int64_t ld, const T* v, int64_t v_stride, int64_t group,
                int64_t len, int64_t head, Sums& acc) {
  int64_t chunks = (head + kLanes - 1) / kLanes;
  for (int64_t t = 0; t < len; ++t) {
    const T* row = v + t * v_stride;
    __m512 vv[kMaxChunks];
    for (int64_t c = 0; c < chunks; ++c) vv[c] = load(row + c * kLanes, lane_mask(c * kLanes, head));
    for (int64_t g = 0; g < group; ++g) {
      __m512 w = _mm512_set1_ps(weights[g * ld + t]);
      for (int64_t c = 0; c < chunks; ++c) acc[g][c] = _mm512_fmadd_ps(w, vv[c], acc[g][c]);
    }
  }
}

void clear(Sums& acc, int64_t group, int64_t head) {
  for (int64_t g = 0; g < group; ++g) {
    for (int64_t c = 0; c < (head + kLanes - 1) / kLanes; ++c) acc[g][c] = _mm512_setzero_ps();
  }
}

// out[g] = acc[g] / sums[g] (zeros where no key was attended), out rows out_stride apart.
template <typename T>
void finish(const Sums& acc, const float* sums, int64_t group, int64_t len, int64_t head, T* out,
            int64_t out_stride) {
  for (int64_t g = 0; g < group; ++g) {
    __m512 inv = _mm512_set1_ps(len > 0 ? 1.0f / sums[g] : 0.0f);
    for (int64_t c = 0; c < (head + kLanes - 1) / kLanes; ++c) {
      store(out + g * out_stride + c * kLanes, _mm512_mul_ps(acc[g][c], inv),
            lane_mask(c * kLanes, head));
    }
  }
}

// out[g] = sum_t weights[g * len + t] v[t] / sums[g].
template <typename T>
void weigh(const float* weights, const float* sums, const T* v, const Views& s, int64_t group,
           int64_t len, int64_t head, T* out) {
  Sums acc;
  clear(acc, group, head);
  accumulate(weights, len, v, s.v[2], group, len, head, acc);
  finish(acc, sums, group, len, head, out, s.out[2]);
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
      score(qb, kb, s, group, len, head, static_cast<float>(scale), scores.data(), len);
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

// x * cos + swap(x) * signed_sin on one head's first R dims, swap exchanging their two halves (the
// fused layers' folded rotary), rounded to C (the tables' dtype: T, or float32 for a model that
// rotates in float32, OLMo 2's) after each multiply and the add, as torch's three ops on x and
// the tables are (no fused multiply-add: the build passes -ffp-contract=off), then to T; dims
// from R on unchanged.
template <typename T, typename C>
inline T rotated(const T* x, const C* cos, const C* signed_sin, int64_t d, int64_t rotary) {
  if (d >= rotary) return x[d];
  int64_t half = rotary / 2, other = d < half ? d + half : d - half;
  C a = static_cast<C>(static_cast<float>(x[d]) * static_cast<float>(cos[d]));
  C b = static_cast<C>(static_cast<float>(x[other]) * static_cast<float>(signed_sin[d]));
  return static_cast<T>(static_cast<C>(static_cast<float>(a) + static_cast<float>(b)));
}

struct StepShape {
  int64_t heads, kv_heads, head, qkv_stride, rope_stride;
  int64_t cache[3];     // element strides of k_cache and v_cache over (h, block, offset)
  int64_t block_size;   // positions per block (S)
  int64_t table_width;  // blocks per block-table row (M)
  int64_t window;       // keys a query sees (0: all before it)
  int64_t rotary;       // the rotated dims of each head (R <= D)
  float softcap;        // scores capped at softcap * tanh(s / softcap) (0: not capped)
};

// Each score s of G rows of len, ld apart, as c tanh(s / c): (s / c), tanh, * c, each rounded to
// float32 as transformers' three ops on float32 scores are.
void cap_scores(float* scores, int64_t group, int64_t len, int64_t ld, float cap) {
  for (int64_t g = 0; g < group; ++g) {
    for (int64_t t = 0; t < len; ++t) {
      float& s = scores[g * ld + t];
      s = std::tanh(s / cap) * cap;
    }
  }
}

// One (token, key/value head) of a step, first half: rotary on its key, and the key and value
// into the cache at the token's position.
template <typename T, typename C>
void write_task(const T* qkv, const C* cos, const C* sin, T* kc, T* vc, const int64_t* blocks,
                int64_t position, int64_t h, const StepShape& z) {
  int64_t head = z.head, size = z.block_size;
  const T* key = qkv + (z.heads + h) * head;
  const T* value = qkv + (z.heads + z.kv_heads + h) * head;
  int64_t here = h * z.cache[0] + blocks[position / size] * z.cache[1] + position % size * z.cache[2];
  for (int64_t d = 0; d < head; ++d) {
    kc[here + d] = rotated(key, cos, sin, d, z.rotary);
    vc[here + d] = value[d];
  }
}

// Second half, once every token's key is in the cache: rotary on its G queries, then the queries
// over the sequence's keys first to position (first = 0, or the window's first), block by block
// through its block-table row.
template <typename T, typename C>
void attend_task(const T* qkv, const C* cos, const C* sin, const T* kc, const T* vc,
                 const int64_t* blocks, int64_t position, int64_t h, const StepShape& z,
                 float scale, T* out, std::vector<float>& scores) {
  int64_t group = z.heads / z.kv_heads, head = z.head, size = z.block_size;
  T queries[kMaxGroup * kLanes * kMaxChunks];
  for (int64_t g = 0; g < group; ++g) {
    const T* query = qkv + (h * group + g) * head;
    for (int64_t d = 0; d < head; ++d) {
      queries[g * head + d] = rotated(query, cos, sin, d, z.rotary);
    }
  }
  Views s{};
  s.q[2] = head, s.k[2] = z.cache[2];
  int64_t first = z.window > 0 ? std::max<int64_t>(0, position + 1 - z.window) : 0;
  int64_t len = position + 1 - first, end = position + 1;
  scores.resize(group * len);
  // block j holds keys [j S, (j + 1) S); of those, [lo, hi) are attended, at scores[lo - first]
  auto each_block = [&](auto&& visit) {
    for (int64_t j = first / size; j * size < end; ++j) {
      int64_t lo = std::max(first, j * size), hi = std::min(end, (j + 1) * size);
      visit(h * z.cache[0] + blocks[j] * z.cache[1] + (lo - j * size) * z.cache[2], lo - first,
            hi - lo);
    }
  };
  each_block([&](int64_t start, int64_t at, int64_t n) {
    score(queries, kc + start, s, group, n, head, scale, scores.data() + at, len);
  });
  if (z.softcap > 0.0f) cap_scores(scores.data(), group, len, len, z.softcap);
  float sums[kMaxGroup];
  softmax_numerators(scores.data(), group, len, sums);
  Sums acc;
  clear(acc, group, head);
  each_block([&](int64_t start, int64_t at, int64_t n) {
    accumulate(scores.data() + at, len, vc + start, z.cache[2], group, n, head, acc);
  });
  finish(acc, sums, group, len, head, out + h * group * head, head);
}

// Every token's keys and values into the cache, then every token's queries over its keys: a
// token of a prefill chunk sees the keys its chunk wrote before it, as causal attention does.
template <typename T, typename C>
void run_step(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
              at::Tensor& kc, at::Tensor& vc, const int64_t* table, const int64_t* slots,
              const int64_t* positions, const StepShape& z, double scale, at::Tensor& out) {
  int64_t tokens = qkv.size(0), kv_heads = z.kv_heads;
  const T* qp = qkv.data_ptr<T>();
  const C *cp = cos.data_ptr<C>(), *sp = sin.data_ptr<C>();
  T *kp = kc.data_ptr<T>(), *vp = vc.data_ptr<T>(), *op = out.data_ptr<T>();
  for (int64_t task = 0; task < tokens * kv_heads; ++task) {
    int64_t t = task / kv_heads, h = task % kv_heads;
    write_task(qp + t * z.qkv_stride, cp + t * z.rope_stride, sp + t * z.rope_stride, kp, vp,
               table + slots[t] * z.table_width, positions[t], h, z);
  }
  int64_t longest = *std::max_element(positions, positions + tokens) + 1;
  if (z.window > 0) longest = std::min(longest, z.window);
  int64_t group = z.heads / kv_heads;
  int64_t grain = std::max<int64_t>(1, kWorkGrain / std::max<int64_t>(1, longest * group));
  at::parallel_for(0, tokens * kv_heads, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t task = begin; task < end; ++task) {
      int64_t t = task / kv_heads, h = task % kv_heads;
      attend_task(qp + t * z.qkv_stride, cp + t * z.rope_stride, sp + t * z.rope_stride, kp, vp,
                  table + slots[t] * z.table_width, positions[t], h, z, static_cast<float>(scale),
                  op + t * z.heads * z.head, scores);
    }
  });
}

// Refuses a call whose tokens, positions or block table lie outside the cache.
void check_places(const at::Tensor& table, const int64_t* slots, const int64_t* positions,
                  int64_t tokens, int64_t num_blocks, int64_t block_size) {
  const int64_t* tp = table.data_ptr<int64_t>();
  for (int64_t i = 0; i < table.numel(); ++i) {
    TORCH_CHECK(tp[i] >= 0 && tp[i] < num_blocks, "block_table names a block outside the cache");
  }
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(slots[t] >= 0 && slots[t] < table.size(0) && positions[t] >= 0 &&
                    positions[t] < table.size(1) * block_size,
                "each token's slot and position must lie within the cache");
    for (int64_t u = 0; u < t; ++u) {
      TORCH_CHECK(slots[u] != slots[t] || positions[u] != positions[t],
                  "one token per slot and position");
    }
  }
}

at::Tensor decode_step(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& signed_sin,
                       at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& block_table,
                       const at::Tensor& slots, const at::Tensor& positions, int64_t heads,
                       double scale, int64_t window, double softcap) {
  TORCH_CHECK(window >= 0, "window: keys a query sees, 0 for all");
  TORCH_CHECK(softcap >= 0.0, "softcap: the scores' cap, 0 for none");
  TORCH_CHECK(qkv.dim() == 2 && qkv.stride(1) == 1, "qkv: [T, (H + 2 H_kv) D], rows contiguous");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() &&
                  k_cache.strides() == v_cache.strides() && k_cache.stride(3) == 1,
              "k_cache, v_cache: [H_kv, N, S, D], alike, each head's values contiguous");
  int64_t tokens = qkv.size(0), kv_heads = k_cache.size(0), head = k_cache.size(3);
  TORCH_CHECK(heads > 0 && heads % kv_heads == 0 && heads / kv_heads <= kMaxGroup &&
                  head % 2 == 0 && head <= kLanes * kMaxChunks,
              "heads must be a multiple of H_kv, up to 16 times it; an even head size up to 256");
  TORCH_CHECK(qkv.size(1) == (heads + 2 * kv_heads) * head, "qkv's width must be (H + 2 H_kv) D");
  TORCH_CHECK(cos.dim() == 2 && cos.sizes() == signed_sin.sizes() && cos.size(0) == tokens &&
                  cos.size(1) > 0 && cos.size(1) <= head && cos.size(1) % 2 == 0 &&
                  cos.stride(1) == 1 && cos.strides() == signed_sin.strides(),
              "cos, signed_sin: [T, R], R <= D even rotated dims, alike, rows contiguous");
  for (auto type : {k_cache.scalar_type(), v_cache.scalar_type()}) {
    TORCH_CHECK(type == qkv.scalar_type(), "qkv and caches share one dtype");
  }
  bool float_tables = cos.scalar_type() == at::kFloat;
  TORCH_CHECK(cos.scalar_type() == signed_sin.scalar_type() &&
                  (float_tables || cos.scalar_type() == qkv.scalar_type()),
              "cos and signed_sin share one dtype: qkv's, or float32");
  auto table = block_table.to(at::kLong).contiguous();
  TORCH_CHECK(table.dim() == 2 && table.size(1) > 0, "block_table: [B, M]");
  auto slot_ids = slots.to(at::kLong).contiguous(), pos = positions.to(at::kLong).contiguous();
  TORCH_CHECK(slot_ids.numel() == tokens && pos.numel() == tokens, "slots, positions: [T]");
  const int64_t *sp = slot_ids.data_ptr<int64_t>(), *pp = pos.data_ptr<int64_t>();
  check_places(table, sp, pp, tokens, k_cache.size(1), k_cache.size(2));
  StepShape z{heads, kv_heads, head, qkv.stride(0), cos.stride(0),
              {k_cache.stride(0), k_cache.stride(1), k_cache.stride(2)}, k_cache.size(2),
              table.size(1), window, cos.size(1), static_cast<float>(softcap)};
  auto out = at::empty({tokens, heads * head}, qkv.options());
  const int64_t* tp = table.data_ptr<int64_t>();
  if (qkv.scalar_type() == at::kFloat) {
    run_step<float, float>(qkv, cos, signed_sin, k_cache, v_cache, tp, sp, pp, z, scale, out);
  } else if (qkv.scalar_type() == at::kBFloat16 && float_tables) {
    run_step<c10::BFloat16, float>(qkv, cos, signed_sin, k_cache, v_cache, tp, sp, pp, z, scale,
                                   out);
  } else if (qkv.scalar_type() == at::kBFloat16) {
    run_step<c10::BFloat16, c10::BFloat16>(qkv, cos, signed_sin, k_cache, v_cache, tp, sp, pp, z,
                                           scale, out);
  } else {
    TORCH_CHECK(false, "decode attention takes float32 or bfloat16");
  }
  return out;
}

}  // namespace

namespace cbp {
at::Tensor decode_step_attention(const at::Tensor& qkv, const at::Tensor& cos,
                                 const at::Tensor& signed_sin, at::Tensor k_cache,
                                 at::Tensor v_cache, const at::Tensor& block_table,
                                 const at::Tensor& slots, const at::Tensor& positions,
                                 int64_t heads, double scale, int64_t window,
                                 double softcap) {
  return decode_step(qkv, cos, signed_sin, k_cache, v_cache, block_table, slots, positions, heads,
                     scale, window, softcap);
}
}  // namespace cbp

TORCH_LIBRARY(cbp_attention, m) {
  m.def("decode(Tensor q, Tensor k, Tensor v, Tensor kv_lens, float scale) -> Tensor");
  m.def(
      "decode_step(Tensor qkv, Tensor cos, Tensor signed_sin, Tensor(a!) k_cache, "
      "Tensor(b!) v_cache, Tensor block_table, Tensor slots, Tensor positions, int heads, "
      "float scale, int window=0, float softcap=0) -> Tensor");
}

TORCH_LIBRARY_IMPL(cbp_attention, CPU, m) {
  m.impl("decode", decode);
  m.impl("decode_step", decode_step);
}
