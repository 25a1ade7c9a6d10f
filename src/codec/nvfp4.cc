// SPDX-License-Identifier: Apache-2.0
// The NVFP4 block operations: choose an instruction-set path, widen bf16/f16
// rows to f32 before quantizing and narrow f32 after dequantizing (both
// through the fp8 codec's raw conversions, spec/CODEC.md sections 5 and 9),
// and their public names in kvfile/codec.h.
#include <memory>
#include <vector>

#include "codec/codec_internal.h"
#include "codec/nvfp4.h"

namespace kvfile::codec::nvfp4 {
namespace {

const internal::Kernels& KernelsFor(Isa isa) {
  switch (codec::internal::ResolveIsa(isa)) {
    case Isa::kAvx512:
      return internal::kAvx512Kernels;
    case Isa::kAvx2:
      return internal::kAvx2Kernels;
    default:
      return internal::kScalarKernels;
  }
}

bool IsRaw(Dtype d) { return d == Dtype::kBF16 || d == Dtype::kF16 || d == Dtype::kF32; }

}  // namespace

bool QuantizeRows(Dtype src_dtype, const void* src, size_t rows, size_t n, uint8_t* packed,
                  uint8_t* block_scales, float* row_scales, size_t* bad_row, Isa isa) {
  if (!IsRaw(src_dtype) || n % kBlock != 0) {
    *bad_row = rows;
    return false;
  }
  const internal::Kernels& k = KernelsFor(isa);
  const size_t es = kvfile::ElementSize(src_dtype);
  std::vector<float> scratch(n);
  for (size_t r = 0; r < rows; ++r) {
    const void* row = static_cast<const unsigned char*>(src) + r * n * es;
    if (!k.quantize_row(src_dtype, row, n, packed + r * n / 2, block_scales + r * n / kBlock,
                        row_scales + r, scratch.data())) {
      *bad_row = r;
      return false;
    }
  }
  return true;
}

void DequantizeRows(const uint8_t* packed, const uint8_t* block_scales, const float* row_scales,
                    size_t rows, size_t n, Dtype dst_dtype, void* dst, Isa isa) {
  if (!IsRaw(dst_dtype) || n % kBlock != 0) return;
  const internal::Kernels& k = KernelsFor(isa);
  const size_t es = kvfile::ElementSize(dst_dtype);
  std::vector<float> scratch(n);
  for (size_t r = 0; r < rows; ++r) {
    void* row = static_cast<unsigned char*>(dst) + r * n * es;
    k.dequantize_row(packed + r * n / 2, block_scales + r * n / kBlock, row_scales[r], n,
                     dst_dtype, row, scratch.data());
  }
}

}  // namespace kvfile::codec::nvfp4

namespace kvfile::codec {

static_assert(kNvfp4Block == nvfp4::kBlock);

bool QuantizeNvfp4Rows(Dtype src_dtype, const void* src, size_t rows, size_t width, uint8_t* packed,
                       uint8_t* block_scales, float* row_scales, size_t* bad_row, Isa isa) {
  return nvfp4::QuantizeRows(src_dtype, src, rows, width, packed, block_scales, row_scales, bad_row, isa);
}

void DequantizeNvfp4Rows(const uint8_t* packed, const uint8_t* block_scales, const float* row_scales,
                         size_t rows, size_t width, Dtype dst_dtype, void* dst, Isa isa) {
  nvfp4::DequantizeRows(packed, block_scales, row_scales, rows, width, dst_dtype, dst, isa);
}

}  // namespace kvfile::codec
