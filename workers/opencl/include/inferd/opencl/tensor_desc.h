// inferd/opencl/tensor_desc.h — tensor virtualization: logical BHWC tensors in physical GPU objects.
//
// ML Drift's tensor virtualization: a kernel sees a *logical* tensor of shape BHWC (batch, height,
// width, channels) whose channels are grouped in slices of 4 (S = ceil(C / 4)); a TensorDescriptor
// also names the *physical* object that stores it and the precision of its elements, and every
// storage holds one RGBA "texel" of 4 elements per (b, x, y, s):
//
//   storage        object                          texel of (b, x, y, s)
//   kBuffer        buffer of B*H*W*S texels        index ((s*H + y)*W + x)*B + b
//   kImageBuffer   image1d_buffer, RGBA            the same linear index
//   kTexture2D     image2d of (W*B) x (H*S), RGBA  (x*B + b, y*S + s)
//   kTexture3D     image3d of (W*B) x H x S, RGBA  (x*B + b, y, s)
//   kTexture2DSplit  P image2d objects, part p      part s / Sp at (x*B + b, y*Sp + s % Sp),
//                  holding slices [p*Sp, (p+1)*Sp)  Sp = ceil(S / P)
//                  of (W*B) x (H*Sp), RGBA
// (A 3D texture takes the slices in its depth, so it holds tensors whose H*S is taller than a 2D
// texture may be; writing it needs cl_khr_3d_image_writes in OpenCL C 1.2. kTexture2DSplit is one
// tensor in several objects: P 2D textures of the same size, each a band of slices, for a tensor
// too tall for one 2D texture on a device without 3D writes. The last part's slices past S are zeros.)
//
//   data type      texel                           buffer element / image channel type
//   kFloat32       16 bytes                        float  / CL_FLOAT
//   kFloat16       8 bytes                         IEEE half (read with vload_half4, written with
//                                                  vstore_half4_rte) / CL_HALF_FLOAT
// Kernels always compute in float: a half tensor is converted on every Read and rounded to nearest
// even on every Write, by the accessors (codegen.h). None of this needs cl_khr_fp16, which only adds
// half *arithmetic*: OpenCL C 1.2 allows half pointers for vload_half/vstore_half, and half images
// are read and written as float by read_imagef/write_imagef. So a half tensor works on every device
// (PoCL included) and halves the activations' memory traffic.
//
// Invariant (the "padding is zero" rule): the channels c >= C of the last slice hold 0. upload()
// writes them as zeros and every op writes zeros there, so reductions over slices need no masking of
// inputs (softmax, whose padding would be exp(0) = 1, masks its own lanes explicitly).
//
// Thread safety: TensorDescriptor and the choosers are values / pure functions. A Tensor is owned and
// used by one thread (its Runtime's); the transfer functions enqueue on the Runtime's queue and block.
#pragma once

#include <cstdint>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "inferd/opencl/cl_runtime.h"
#include "inferd/status.h"

namespace inferd::opencl {

enum class StorageType : uint8_t { kBuffer, kImageBuffer, kTexture2D, kTexture3D, kTexture2DSplit };
inline constexpr StorageType kAllStorageTypes[] = {StorageType::kBuffer, StorageType::kImageBuffer,
                                                   StorageType::kTexture2D, StorageType::kTexture3D,
                                                   StorageType::kTexture2DSplit};
// "buffer", "image_buffer", "texture2d", "texture3d", "texture2d_split"
const char* storage_name(StorageType storage);
inline constexpr bool is_texture(StorageType s) {
  return s == StorageType::kTexture2D || s == StorageType::kTexture3D || s == StorageType::kTexture2DSplit;
}
// Most objects of one kTexture2DSplit tensor.
inline constexpr int32_t kMaxTextureParts = 8;

enum class DataType : uint8_t { kFloat32, kFloat16 };
inline constexpr DataType kAllDataTypes[] = {DataType::kFloat32, DataType::kFloat16};
const char* data_type_name(DataType type);  // "f32", "f16"
inline constexpr size_t texel_bytes(DataType type) { return type == DataType::kFloat16 ? 8 : 16; }

// What a kernel needs to know of a tensor to address it: its storage, its data type and, for
// kTexture2DSplit, its number of parts (1 for every other storage). Implicit from a StorageType
// (float32), so that code about float tensors names the storage only.
struct TensorFormat {
  StorageType storage = StorageType::kBuffer;
  DataType data_type = DataType::kFloat32;
  int32_t parts = 1;

  constexpr TensorFormat() = default;
  constexpr TensorFormat(StorageType s, DataType t = DataType::kFloat32, int32_t p = 1)  // NOLINT
      : storage(s), data_type(t), parts(s == StorageType::kTexture2DSplit ? p : 1) {}
  bool operator==(const TensorFormat&) const = default;
  // "buffer", "texture2d(f16)", "texture2d_split[3]": the parts of a split, the data type when it is
  // not f32.
  std::string to_string() const;
};

// A set of storages (what a kernel can read or write), one bit per StorageType.
using StorageMask = uint32_t;
constexpr StorageMask storage_bit(StorageType s) { return 1u << static_cast<unsigned>(s); }
inline constexpr StorageMask kAnyStorage = (1u << std::size(kAllStorageTypes)) - 1;

// A logical shape. Every extent is >= 1.
struct Bhwc {
  int32_t b = 1, h = 1, w = 1, c = 1;

  int32_t slices() const { return (c + 3) / 4; }
  int64_t elements() const { return int64_t{b} * h * w * c; }
  // Dense logical index of (b, x, y, c): channels fastest, then x, y, b (the host-side order that
  // upload() and download() use).
  int64_t offset(int32_t bi, int32_t x, int32_t y, int32_t ci) const { return ((int64_t{bi} * h + y) * w + x) * c + ci; }
  bool operator==(const Bhwc&) const = default;
  std::string to_string() const;  // "1x1x7x67" (BxHxWxC)
};

class TensorDescriptor {
 public:
  // A kTexture2DSplit format's parts are clamped to [1, min(S, kMaxTextureParts)] (no empty part).
  TensorDescriptor(Bhwc shape, TensorFormat format);
  TensorDescriptor(Bhwc shape, StorageType storage, DataType type = DataType::kFloat32, int32_t parts = 1)
      : TensorDescriptor(shape, TensorFormat(storage, type, parts)) {}

  const Bhwc& shape() const { return shape_; }
  const TensorFormat& format() const { return format_; }
  StorageType storage() const { return format_.storage; }
  DataType data_type() const { return format_.data_type; }
  int32_t slices() const { return shape_.slices(); }
  int32_t parts() const { return format_.parts; }
  // Slices per part: S for every storage but kTexture2DSplit, ceil(S / P) there.
  int32_t part_slices() const { return (slices() + parts() - 1) / parts(); }
  // The logical texels, B*H*W*S.
  int64_t texel_count() const { return int64_t{shape_.b} * shape_.h * shape_.w * slices(); }
  // The texels the objects hold: texel_count(), or P parts of B*H*W*Sp for kTexture2DSplit.
  int64_t stored_texels() const { return int64_t{shape_.b} * shape_.h * shape_.w * part_slices() * parts(); }
  size_t texel_bytes() const { return opencl::texel_bytes(format_.data_type); }
  size_t data_bytes() const { return static_cast<size_t>(stored_texels()) * texel_bytes(); }

  // Linear texel index of kBuffer / kImageBuffer.
  int64_t linear_index(int32_t b, int32_t x, int32_t y, int32_t s) const {
    return ((int64_t{s} * shape_.h + y) * shape_.w + x) * shape_.b + b;
  }
  // The extents of a texture (of each part): kTexture2D (W*B) x (H*S) x 1, kTexture3D (W*B) x H x S,
  // kTexture2DSplit (W*B) x (H*Sp) x 1.
  int64_t texture_width() const { return int64_t{shape_.w} * shape_.b; }
  int64_t texture_height() const {
    return storage() == StorageType::kTexture3D ? shape_.h : int64_t{shape_.h} * part_slices();
  }
  int64_t texture_depth() const { return storage() == StorageType::kTexture3D ? slices() : 1; }
  // Position of (b, x, y, s) in this storage's host staging order: the linear index for the linear
  // storages and for kTexture3D (whose row-major order, ((s*H + y)*W*B + x*B + b), is the same),
  // row-major (y*S + s) * width + (x*B + b) for kTexture2D, and for kTexture2DSplit the parts one
  // after the other, each row-major: (p*H*Sp + y*Sp + s % Sp) * width + (x*B + b), p = s / Sp.
  int64_t staging_index(int32_t b, int32_t x, int32_t y, int32_t s) const;

  // OK when this storage can hold the shape on `device`; kUnimplemented when the device lacks the
  // storage (no images), kOutOfRange naming the limit that is exceeded otherwise.
  Status fits(const DeviceInfo& device) const;
  std::string to_string() const;  // "1x1x7x67 texture2d", "1x1x7x67 buffer(f16)"

 private:
  Bhwc shape_;
  TensorFormat format_;
};

// ---- Choosing a storage --------------------------------------------------------------------------

// The device's order of preference: on GPUs kTexture2D, kTexture3D, kTexture2DSplit, kImageBuffer,
// kBuffer (reads through the texture cache, ML Drift's default; the 3D texture, then several 2D ones,
// where one 2D texture is too tall); on CPUs and other devices kBuffer first, since images are
// emulated in software there.
std::vector<StorageType> storage_preference(const DeviceInfo& device);

// The fewest parts, at least 2, in which a kTexture2DSplit of `shape` fits the device's 2D texture
// height (kMaxTextureParts when even those do not: fits() then says why).
int32_t split_parts(const DeviceInfo& device, const Bhwc& shape);

struct StorageChoice {
  StorageType storage = StorageType::kBuffer;
  int32_t parts = 1;  // kTexture2DSplit: the fewest parts that fit
  // Why each more preferred storage was passed over ("texture2d: height 37984 > CL_DEVICE_IMAGE2D_
  // MAX_HEIGHT 16384"); empty when the first preference was taken.
  std::vector<std::string> fallbacks;
  std::string to_string() const;
};

// The first storage in the device's preference that the kernel supports (`kernel_supports`) and that
// fits the device's limits for `shape` in data type `type`. kOutOfRange with every reason when none does.
Result<StorageChoice> choose_storage(const DeviceInfo& device, const Bhwc& shape,
                                     StorageMask kernel_supports = kAnyStorage,
                                     DataType type = DataType::kFloat32);

// A tensor that a storage must hold: its shape and data type.
struct TensorSpec {
  Bhwc shape;
  DataType type = DataType::kFloat32;
};
// The same for several tensors that share one storage (a split's parts: the most any of them needs).
Result<StorageChoice> choose_storage(const DeviceInfo& device, std::span<const TensorSpec> tensors,
                                     StorageMask kernel_supports = kAnyStorage);

// The storages worth timing for `tensors` (OpenClOptions::storage_policy kMeasure), in the device's
// preference order: the first texture (2D, else 3D, else a split) that holds them, kImageBuffer and
// kBuffer, each where it fits and the device has it. Empty when none fits.
std::vector<StorageChoice> storage_candidates(const DeviceInfo& device, std::span<const TensorSpec> tensors);

// ---- Device tensors ----------------------------------------------------------------------------

struct AllocOptions {
  // Sentinel room around the data, for tests and debugging; fill_guards() / check_guards() use it.
  //   kBuffer       this many texels (rounded up to the device's sub-buffer alignment) before and after
  //                 the data, in one parent buffer of which the tensor's buffer is a sub-buffer;
  //   kImageBuffer  the same room after the data only: the image views the start of a larger buffer
  //                 (drivers such as PoCL cannot make an image of a sub-buffer);
  //   kTexture2D    this many extra columns and rows;
  //   kTexture3D    this many extra columns, rows and slices;
  //   kTexture2DSplit  each part this many extra columns and rows.
  int32_t guard_texels = 0;
};

// A logical tensor on the device: the cl_mem objects of one descriptor.
class Tensor {
 public:
  static Result<Tensor> allocate(Runtime& rt, const TensorDescriptor& desc, const AllocOptions& options = {});

  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;

  // A tensor of `shape` over this one's memory, which it shares (the cl_mem objects are reference-
  // counted): a forward pass of T tokens runs on views of activations allocated once for the most
  // tokens, and since kernels receive the extents as arguments no kernel is rebuilt for a new T.
  // `shape` must have this tensor's batch, height and channels and at most its width; every texel of
  // the view then lies inside the storage (linear storages: fewer texels; kTexture2D: a narrower
  // rectangle). The view has no guards; its contents are those of the memory in the view's own
  // layout (meaningful only once a kernel has written them). kInvalidArgument otherwise.
  Result<Tensor> view(const Bhwc& shape) const;

  const TensorDescriptor& desc() const { return desc_; }
  const Bhwc& shape() const { return desc_.shape(); }
  StorageType storage() const { return desc_.storage(); }
  const TensorFormat& format() const { return desc_.format(); }
  // The object a kernel binds: the buffer, the image1d_buffer, the image2d or the image3d; part
  // `part` (0 .. desc().parts() - 1) of a kTexture2DSplit, each bound in order. nullptr when there is
  // no such object (a moved-from tensor).
  cl_mem memory(int32_t part = 0) const {
    if (storage() == StorageType::kBuffer) return part == 0 ? buffer_.get() : nullptr;
    return static_cast<size_t>(part) < images_.size() ? images_[static_cast<size_t>(part)].get() : nullptr;
  }
  // The buffer behind kBuffer and kImageBuffer (nullptr for the textures).
  cl_mem buffer() const { return buffer_.get(); }

  int32_t guard_texels() const { return guard_texels_; }
  // Linear storages: the buffer holding [guard before | data | guard after], and the guards' sizes
  // in bytes (0 without guards; the data starts at guard_before_bytes()).
  cl_mem guard_parent() const { return parent_ ? parent_.get() : buffer_.get(); }
  size_t guard_before_bytes() const { return guard_before_bytes_; }
  size_t guard_after_bytes() const { return guard_after_bytes_; }

 private:
  explicit Tensor(const TensorDescriptor& desc) : desc_(desc) {}

  TensorDescriptor desc_;
  ClMem parent_;  // guarded kBuffer: guard | data | guard; buffer_ is a sub-buffer of it
  ClMem buffer_;  // kBuffer's data; kImageBuffer's backing buffer (data | guard when guarded)
  std::vector<ClMem> images_;  // the image storages' objects: one, or the parts of a kTexture2DSplit
  int32_t guard_texels_ = 0;
  size_t guard_before_bytes_ = 0, guard_after_bytes_ = 0;
};

// Transfers convert between the host's floats and the tensor's data type (a half tensor's upload
// rounds to nearest even, as vstore_half4_rte).
//
// Writes a logical tensor (`data` in Bhwc::offset order, shape().elements() floats); the channels of
// the last slice past C are written as zeros.
Status upload(Runtime& rt, Tensor& tensor, std::span<const float> data);
// Reads the logical tensor back (shape().elements() floats).
Status download(Runtime& rt, const Tensor& tensor, std::span<float> data);

// The same without waiting for the device (Transfer::kEnqueue): the host side lives in a TransferStaging
// of the caller's, which must stay alive and untouched until the queue has run the transfer (the next
// host wait: Runtime::finish() or a kWait transfer). A download is read out by download_finished after
// that wait. A step enqueues its inputs and outputs this way and waits once.
struct TransferStaging {
  std::vector<float> floats;
  std::vector<uint16_t> halves;  // a kFloat16 tensor's halves, as the device holds them
};
Status upload_enqueued(Runtime& rt, Tensor& tensor, std::span<const float> data, TransferStaging& staging);
Status download_enqueued(Runtime& rt, const Tensor& tensor, TransferStaging& staging);
Status download_finished(const Tensor& tensor, TransferStaging& staging, std::span<float> data);
// The physical texels (4 * texel_count() floats, in linear_index order for every storage), padding
// lanes included: tests check the padding-is-zero invariant with it.
Result<std::vector<float>> download_texels(Runtime& rt, const Tensor& tensor);
// Sets every texel, padding lanes included, to `value` (tests fill outputs with NaN first so that a
// texel a kernel forgets to write shows up).
Status fill(Runtime& rt, Tensor& tensor, float value);

// Writes `value` (in the tensor's data type) into the guard regions / checks that they still hold it
// bit for bit. check_guards()
// returns kCorrupt naming the first overwritten position (an out-of-bounds write by a kernel).
// Both are no-ops for a tensor allocated without guards.
Status fill_guards(Runtime& rt, Tensor& tensor, float value);
Status check_guards(Runtime& rt, const Tensor& tensor, float value);

}  // namespace inferd::opencl
