// x86 SIMD plumbing the kernels share: <immintrin.h> (quietened for a GCC 12 header warning), the
// function-level target attribute of each ISA path (kernels for every path live in one binary and
// are chosen at run time, see cpu_isa.h), and vector math used by more than one kernel.
#pragma once

#if defined(__x86_64__)
// GCC 12's AVX-512 headers start some intrinsics from _mm512_undefined_*() and trip its own
// -Wmaybe-uninitialized and -Wuninitialized (GCC bug 105593); the warning is about the header, not
// our code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif

#define INFERD_AVX2 __attribute__((target("avx2,fma,f16c")))
#define INFERD_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define INFERD_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

namespace inferd {

// exp_avx512 without its clamp: for x already in [-87, 88] (the same bits there).
INFERD_AVX512 inline __m512 exp_avx512_unclamped(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3333519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// e^x, x clamped to [-87, 88]: range reduction to [-ln2/2, ln2/2] (n = round(x / ln2)), a degree-6
// polynomial (Cephes' expf coefficients, about 2 ulp) and exact scaling by 2^n. packed_matmul.cpp's
// exp_poly (kernels/exp_poly.h) is its scalar mirror, operation for operation.
INFERD_AVX512 inline __m512 exp_avx512(__m512 x) {
  return exp_avx512_unclamped(_mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f)));
}

}  // namespace inferd
#endif  // __x86_64__
