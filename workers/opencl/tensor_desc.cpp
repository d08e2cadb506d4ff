#include "inferd/opencl/tensor_desc.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <sstream>

#include "inferd/kernels/cpu.h"

namespace inferd::opencl {

const char* storage_name(StorageType storage) {
  switch (storage) {
    case StorageType::kBuffer: return "buffer";
    case StorageType::kImageBuffer: return "image_buffer";
    case StorageType::kTexture2D: return "texture2d";
    case StorageType::kTexture3D: return "texture3d";
    case StorageType::kTexture2DSplit: return "texture2d_split";
  }
  return "?";
}

const char* data_type_name(DataType type) {
  switch (type) {
    case DataType::kFloat32: return "f32";
    case DataType::kFloat16: return "f16";
  }
  return "?";
}

std::string TensorFormat::to_string() const {
  std::string text = storage_name(storage);
  if (storage == StorageType::kTexture2DSplit) {
    text += '[';
    text += std::to_string(parts);
    text += ']';
  }
  if (data_type != DataType::kFloat32) text += std::string("(") + data_type_name(data_type) + ")";
  return text;
}

std::string Bhwc::to_string() const {
  return std::to_string(b) + "x" + std::to_string(h) + "x" + std::to_string(w) + "x" + std::to_string(c);
}

TensorDescriptor::TensorDescriptor(Bhwc shape, TensorFormat format) : shape_(shape), format_(format) {
  INFERD_ASSERT(shape.b >= 1 && shape.h >= 1 && shape.w >= 1 && shape.c >= 1, "every extent of a shape is >= 1");
  if (format_.storage != StorageType::kTexture2DSplit) format_.parts = 1;
  format_.parts = std::clamp(format_.parts, 1, std::min(shape_.slices(), kMaxTextureParts));
  format_.parts = (shape_.slices() + part_slices() - 1) / part_slices();  // no part left empty
}

int64_t TensorDescriptor::staging_index(int32_t b, int32_t x, int32_t y, int32_t s) const {
  if (storage() == StorageType::kTexture2DSplit) {
    const int32_t sp = part_slices();
    return ((int64_t{s / sp} * shape_.h + y) * sp + s % sp) * texture_width() + int64_t{x} * shape_.b + b;
  }
  if (storage() == StorageType::kTexture2D) {
    return (int64_t{y} * slices() + s) * texture_width() + int64_t{x} * shape_.b + b;
  }
  return linear_index(b, x, y, s);
}

Status TensorDescriptor::fits(const DeviceInfo& device) const {
  const std::string name = format_.to_string();
  const StorageType kind = storage();
  // Kernels compute texel indices in 32-bit ints (see codegen.h).
  if (texel_count() > INT32_MAX) {
    return make_error(Code::kOutOfRange, "%s: %lld texels exceed 32-bit indexing", name.c_str(),
                      static_cast<long long>(texel_count()));
  }
  if (kind == StorageType::kBuffer || kind == StorageType::kImageBuffer) {
    if (data_bytes() > device.max_alloc_bytes) {
      return make_error(Code::kOutOfRange, "%s: %zu bytes > CL_DEVICE_MAX_MEM_ALLOC_SIZE %llu", name.c_str(),
                        data_bytes(), static_cast<unsigned long long>(device.max_alloc_bytes));
    }
  }
  if (kind == StorageType::kBuffer) return Status::ok();
  if (!device.image_support) return make_error(Code::kUnimplemented, "%s: the device has no images", name.c_str());
  if (kind == StorageType::kImageBuffer) {
    if (device.image_max_buffer_size == 0) {
      return make_error(Code::kUnimplemented, "%s: the device has no image buffers (OpenCL < 1.2)", name.c_str());
    }
    if (static_cast<uint64_t>(texel_count()) > device.image_max_buffer_size) {
      return make_error(Code::kOutOfRange, "%s: %lld texels > CL_DEVICE_IMAGE_MAX_BUFFER_SIZE %zu", name.c_str(),
                        static_cast<long long>(texel_count()), device.image_max_buffer_size);
    }
    return Status::ok();
  }
  if (kind == StorageType::kTexture3D) {
    if (!device.has_extension("cl_khr_3d_image_writes")) {
      return make_error(Code::kUnimplemented, "%s: the device lacks cl_khr_3d_image_writes", name.c_str());
    }
    const struct {
      int64_t extent;
      size_t limit;
      const char* what;
      const char* param;
    } dims[] = {{texture_width(), device.image3d_max_width, "width", "CL_DEVICE_IMAGE3D_MAX_WIDTH"},
                {texture_height(), device.image3d_max_height, "height", "CL_DEVICE_IMAGE3D_MAX_HEIGHT"},
                {texture_depth(), device.image3d_max_depth, "depth", "CL_DEVICE_IMAGE3D_MAX_DEPTH"}};
    for (const auto& d : dims) {
      if (static_cast<uint64_t>(d.extent) > d.limit) {
        return make_error(Code::kOutOfRange, "%s: %s %lld > %s %zu", name.c_str(), d.what,
                          static_cast<long long>(d.extent), d.param, d.limit);
      }
    }
    return Status::ok();
  }
  if (static_cast<uint64_t>(texture_width()) > device.image2d_max_width) {
    return make_error(Code::kOutOfRange, "%s: width %lld > CL_DEVICE_IMAGE2D_MAX_WIDTH %zu", name.c_str(),
                      static_cast<long long>(texture_width()), device.image2d_max_width);
  }
  if (static_cast<uint64_t>(texture_height()) > device.image2d_max_height) {
    return make_error(Code::kOutOfRange, "%s: height %lld > CL_DEVICE_IMAGE2D_MAX_HEIGHT %zu", name.c_str(),
                      static_cast<long long>(texture_height()), device.image2d_max_height);
  }
  return Status::ok();
}

std::string TensorDescriptor::to_string() const { return shape_.to_string() + " " + format_.to_string(); }

// ---- Choosing a storage --------------------------------------------------------------------------

std::vector<StorageType> storage_preference(const DeviceInfo& device) {
  if (device.type == DeviceType::kGpu) {
    return {StorageType::kTexture2D, StorageType::kTexture3D, StorageType::kTexture2DSplit, StorageType::kImageBuffer,
            StorageType::kBuffer};
  }
  return {StorageType::kBuffer, StorageType::kImageBuffer, StorageType::kTexture2D, StorageType::kTexture3D,
          StorageType::kTexture2DSplit};
}

std::string StorageChoice::to_string() const {
  std::string text = TensorFormat(storage, DataType::kFloat32, parts).to_string();
  for (const std::string& why : fallbacks) text += " (passed over " + why + ")";
  return text;
}

int32_t split_parts(const DeviceInfo& device, const Bhwc& shape) {
  const auto max_height = static_cast<int64_t>(device.image2d_max_height);
  for (int32_t p = 2; p < kMaxTextureParts; ++p) {
    if (int64_t{shape.h} * ((shape.slices() + p - 1) / p) <= max_height) return p;
  }
  return kMaxTextureParts;
}

Result<StorageChoice> choose_storage(const DeviceInfo& device, const Bhwc& shape, StorageMask kernel_supports,
                                     DataType type) {
  const TensorSpec one[] = {{shape, type}};
  return choose_storage(device, one, kernel_supports);
}

Result<StorageChoice> choose_storage(const DeviceInfo& device, std::span<const TensorSpec> tensors,
                                     StorageMask kernel_supports) {
  INFERD_ASSERT(!tensors.empty(), "choose_storage needs a tensor");
  StorageChoice choice;
  for (StorageType storage : storage_preference(device)) {
    if ((kernel_supports & storage_bit(storage)) == 0) {
      choice.fallbacks.push_back(std::string(storage_name(storage)) + ": not supported by the kernel");
      continue;
    }
    int32_t parts = 1;
    if (storage == StorageType::kTexture2DSplit) {
      for (const TensorSpec& t : tensors) parts = std::max(parts, split_parts(device, t.shape));
    }
    Status fits = Status::ok();
    int32_t used_parts = 1;
    for (const TensorSpec& t : tensors) {
      const TensorDescriptor desc(t.shape, storage, t.type, parts);
      if (fits) fits = desc.fits(device);
      used_parts = std::max(used_parts, desc.parts());
    }
    if (fits) {
      choice.storage = storage;
      choice.parts = used_parts;
      return choice;
    }
    choice.fallbacks.push_back(fits.message());
  }
  std::string shapes, reasons;
  for (const TensorSpec& t : tensors) shapes += (shapes.empty() ? "" : " and ") + t.shape.to_string();
  for (const std::string& why : choice.fallbacks) reasons += (reasons.empty() ? "" : "; ") + why;
  return Status(Code::kOutOfRange, "no storage holds a " + shapes + " tensor: " + reasons);
}

std::vector<StorageChoice> storage_candidates(const DeviceInfo& device, std::span<const TensorSpec> tensors) {
  std::vector<StorageChoice> candidates;
  bool texture = false;
  for (StorageType storage : storage_preference(device)) {
    if (is_texture(storage) && texture) continue;  // one texture: the first that holds the tensors
    auto choice = choose_storage(device, tensors, storage_bit(storage));
    if (!choice) continue;
    choice->fallbacks.clear();
    texture = texture || is_texture(storage);
    candidates.push_back(std::move(choice).value());
  }
  return candidates;
}

// ---- Device tensors ----------------------------------------------------------------------------

namespace {

cl_image_format image_format(DataType type) {
  return {CL_RGBA, static_cast<cl_channel_type>(type == DataType::kFloat16 ? CL_HALF_FLOAT : CL_FLOAT)};
}

size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

// The staging order of `desc` with the logical data scattered in and zero padding.
std::vector<float> to_staging(const TensorDescriptor& desc, std::span<const float> data) {
  const Bhwc& s = desc.shape();
  std::vector<float> staging(static_cast<size_t>(desc.stored_texels()) * 4, 0.0f);
  for (int32_t b = 0; b < s.b; ++b) {
    for (int32_t y = 0; y < s.h; ++y) {
      for (int32_t x = 0; x < s.w; ++x) {
        const float* row = &data[static_cast<size_t>(s.offset(b, x, y, 0))];
        for (int32_t c = 0; c < s.c; ++c) {
          staging[static_cast<size_t>(desc.staging_index(b, x, y, c / 4) * 4 + c % 4)] = row[c];
        }
      }
    }
  }
  return staging;
}

// A box of texels in an image: {x, y, z, width, height, depth}.
struct Rect {
  size_t x, y, z, w, h, d;
  size_t texels() const { return w * h * d; }
};
// The box of a texture's data (of each part; guards excluded).
Rect texture_region(const TensorDescriptor& desc) {
  return {0, 0, 0, static_cast<size_t>(desc.texture_width()), static_cast<size_t>(desc.texture_height()),
          static_cast<size_t>(desc.texture_depth())};
}

// Copies `box` of `image` to `bytes` (`to_host`) or back, packed row by row and slice by slice.
Status copy_box(Runtime& rt, cl_mem image, const Rect& box, size_t texel_bytes, void* bytes, bool to_host,
                Transfer how = Transfer::kWait) {
  const size_t origin[3] = {box.x, box.y, box.z};
  const size_t region[3] = {box.w, box.h, box.d};
  const size_t row_pitch = box.w * texel_bytes;
  const size_t slice_pitch = box.d > 1 ? row_pitch * box.h : 0;  // the spec wants 0 for 2D images
  return to_host ? rt.read_image(image, origin, region, row_pitch, slice_pitch, bytes, how)
                 : rt.write_image(image, origin, region, row_pitch, slice_pitch, bytes, how);
}

// Copies the texels of `tensor` in its staging order as the device holds them (floats, or halves
// for a kFloat16 tensor) from the device into `bytes` (`to_host`) or back; `bytes` holds data_bytes().
// A split texture's parts but the last are always enqueued: the last transfer waits for them.
Status transfer_raw(Runtime& rt, const Tensor& tensor, void* bytes, bool to_host, Transfer how = Transfer::kWait) {
  const TensorDescriptor& desc = tensor.desc();
  if (!is_texture(desc.storage())) {
    return to_host ? rt.read_buffer(tensor.buffer(), 0, desc.data_bytes(), bytes, how)
                   : rt.write_buffer(tensor.buffer(), 0, desc.data_bytes(), bytes, how);
  }
  const Rect box = texture_region(desc);
  const size_t part_bytes = box.texels() * desc.texel_bytes();
  for (int32_t p = 0; p < desc.parts(); ++p) {  // a kTexture2DSplit's parts one after the other
    Status st = copy_box(rt, tensor.memory(p), box, desc.texel_bytes(),
                         static_cast<char*>(bytes) + static_cast<size_t>(p) * part_bytes, to_host,
                         p + 1 == desc.parts() ? how : Transfer::kEnqueue);
    if (!st) {
      // The parts enqueued before must not outlive a waiting caller's memory.
      if (p > 0 && how == Transfer::kWait) (void)rt.finish();
      return st;
    }
  }
  return Status::ok();
}
// After a download_enqueued() of `desc`'s tensor has run: its staging texels as floats in staging.floats
// (converted from the halves of a kFloat16 tensor).
void staged_floats(const TensorDescriptor& desc, TransferStaging& staging) {
  if (desc.data_type() == DataType::kFloat16) {
    staging.floats.resize(staging.halves.size());
    kernels::fp16_to_fp32_row(staging.halves.data(), staging.floats.data(), static_cast<int64_t>(staging.halves.size()));
  }
  INFERD_ASSERT(staging.floats.size() == static_cast<size_t>(desc.stored_texels()) * 4,
                "the staging of a download that did not run");
}

// The staging texels as floats: download_enqueued(), one wait, staged_floats().
Status read_staging(Runtime& rt, const Tensor& tensor, std::vector<float>& floats) {
  TransferStaging staging;
  const Status st = download_enqueued(rt, tensor, staging);
  const Status waited = rt.finish();
  INFERD_RETURN_IF_ERROR(st);
  INFERD_RETURN_IF_ERROR(waited);
  staged_floats(tensor.desc(), staging);
  floats = std::move(staging.floats);
  return Status::ok();
}

// kInvalidArgument unless `n` floats are the logical tensor's.
Status check_elements(const char* op, const Tensor& tensor, size_t n) {
  if (static_cast<int64_t>(n) == tensor.shape().elements()) return Status::ok();
  return make_error(Code::kInvalidArgument, "%s: %zu floats for a %s tensor", op, n, tensor.shape().to_string().c_str());
}

// The bits of one element of `type` holding `value` (a half rounded to nearest even), for the fill
// patterns of buffers and the guard checks.
uint32_t element_bits(DataType type, float value) {
  if (type == DataType::kFloat16) return kernels::fp32_to_fp16(value);
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}
size_t element_bytes(DataType type) { return texel_bytes(type) / 4; }

// Fills `bytes` bytes of `buffer` from `offset` with elements of `type` holding `value`.
Status fill_elements(Runtime& rt, cl_mem buffer, DataType type, float value, size_t offset, size_t bytes) {
  if (type == DataType::kFloat16) {
    const fp16_t pattern = kernels::fp32_to_fp16(value);
    INFERD_CL_RETURN_IF_ERROR(
        clEnqueueFillBuffer(rt.queue(), buffer, &pattern, sizeof(pattern), offset, bytes, 0, nullptr, nullptr));
  } else {
    INFERD_CL_RETURN_IF_ERROR(
        clEnqueueFillBuffer(rt.queue(), buffer, &value, sizeof(value), offset, bytes, 0, nullptr, nullptr));
  }
  return Status::ok();
}

// The guard boxes of a guarded texture: the extra columns (over every row and slice), the extra
// rows under the data columns (over every slice) and, for kTexture3D, the extra slices behind the
// data.
std::vector<Rect> texture_guards(const Tensor& tensor) {
  const size_t g = static_cast<size_t>(tensor.guard_texels());
  const size_t w = static_cast<size_t>(tensor.desc().texture_width());
  const size_t h = static_cast<size_t>(tensor.desc().texture_height());
  if (tensor.storage() != StorageType::kTexture3D) return {Rect{w, 0, 0, g, h + g, 1}, Rect{0, h, 0, w, g, 1}};
  const size_t d = static_cast<size_t>(tensor.desc().texture_depth());
  return {Rect{w, 0, 0, g, h + g, d + g}, Rect{0, h, 0, w, g, d + g}, Rect{0, 0, d, w, h, g}};
}

}  // namespace

Result<Tensor> Tensor::allocate(Runtime& rt, const TensorDescriptor& desc, const AllocOptions& options) {
  INFERD_RETURN_IF_ERROR(desc.fits(rt.info()));
  if (options.guard_texels < 0) return Status(Code::kInvalidArgument, "guard_texels < 0");
  Tensor tensor(desc);
  tensor.guard_texels_ = options.guard_texels;
  cl_int err = CL_SUCCESS;

  if (is_texture(desc.storage())) {
    const size_t g = static_cast<size_t>(options.guard_texels);
    const bool three_d = desc.storage() == StorageType::kTexture3D;
    cl_image_desc image{};
    image.image_type = three_d ? CL_MEM_OBJECT_IMAGE3D : CL_MEM_OBJECT_IMAGE2D;
    image.image_width = static_cast<size_t>(desc.texture_width()) + g;
    image.image_height = static_cast<size_t>(desc.texture_height()) + g;
    image.image_depth = three_d ? static_cast<size_t>(desc.texture_depth()) + g : 1;
    const cl_image_format format = image_format(desc.data_type());
    for (int32_t p = 0; p < desc.parts(); ++p) {
      tensor.images_.emplace_back(clCreateImage(rt.context(), CL_MEM_READ_WRITE, &format, &image, nullptr, &err));
      if (err != CL_SUCCESS) return cl_error(err, "clCreateImage(" + desc.to_string() + ")");
    }
    return tensor;
  }

  const size_t align = std::max<size_t>(rt.info().mem_base_addr_align_bytes, 16);
  const size_t guard = round_up(static_cast<size_t>(options.guard_texels) * desc.texel_bytes(), align);
  if (guard > 0 && desc.storage() == StorageType::kBuffer) {
    tensor.guard_before_bytes_ = tensor.guard_after_bytes_ = guard;
    auto parent = rt.create_buffer(desc.data_bytes() + 2 * guard);
    if (!parent) return parent.status();
    tensor.parent_ = std::move(parent.value());
    const cl_buffer_region region = {guard, desc.data_bytes()};
    tensor.buffer_.reset(clCreateSubBuffer(tensor.parent_.get(), CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION,
                                           &region, &err));
    if (err != CL_SUCCESS) return cl_error(err, "clCreateSubBuffer");
  } else {
    tensor.guard_after_bytes_ = guard;  // kImageBuffer: the image covers the buffer's first data_bytes()
    auto buffer = rt.create_buffer(desc.data_bytes() + guard);
    if (!buffer) return buffer.status();
    tensor.buffer_ = std::move(buffer.value());
  }
  if (desc.storage() == StorageType::kImageBuffer) {
    cl_image_desc image{};
    image.image_type = CL_MEM_OBJECT_IMAGE1D_BUFFER;
    image.image_width = static_cast<size_t>(desc.texel_count());
    image.buffer = tensor.buffer_.get();
    const cl_image_format format = image_format(desc.data_type());
    tensor.images_.emplace_back(clCreateImage(rt.context(), CL_MEM_READ_WRITE, &format, &image, nullptr, &err));
    if (err != CL_SUCCESS) return cl_error(err, "clCreateImage(" + desc.to_string() + ")");
  }
  return tensor;
}

Result<Tensor> Tensor::view(const Bhwc& shape) const {
  const Bhwc& s = desc_.shape();
  if (shape.b != s.b || shape.h != s.h || shape.c != s.c || shape.w < 1 || shape.w > s.w) {
    return make_error(Code::kInvalidArgument, "a %s view of a %s tensor", shape.to_string().c_str(),
                      desc_.to_string().c_str());
  }
  auto share = [](const ClMem& mem) {
    if (!mem) return ClMem();
    const cl_int err = clRetainMemObject(mem.get());
    INFERD_ASSERT(err == CL_SUCCESS, "clRetainMemObject of a live object failed");
    return ClMem(mem.get());
  };
  Tensor view(TensorDescriptor(shape, format()));
  view.parent_ = share(parent_);
  view.buffer_ = share(buffer_);
  for (const ClMem& image : images_) view.images_.push_back(share(image));
  return view;
}

// upload() and download() are the enqueued transfers below and one wait (which also covers a failed
// transfer's parts already enqueued: the staging must outlive them).
Status upload(Runtime& rt, Tensor& tensor, std::span<const float> data) {
  TransferStaging staging;
  const Status st = upload_enqueued(rt, tensor, data, staging);
  const Status waited = rt.finish();
  return st ? waited : st;
}

namespace {

// The logical floats of a tensor from its staging texels.
void from_staging(const TensorDescriptor& desc, const std::vector<float>& staging, std::span<float> data) {
  const Bhwc& s = desc.shape();
  for (int32_t b = 0; b < s.b; ++b) {
    for (int32_t y = 0; y < s.h; ++y) {
      for (int32_t x = 0; x < s.w; ++x) {
        for (int32_t c = 0; c < s.c; ++c) {
          data[static_cast<size_t>(s.offset(b, x, y, c))] =
              staging[static_cast<size_t>(desc.staging_index(b, x, y, c / 4) * 4 + c % 4)];
        }
      }
    }
  }
}

}  // namespace

Status download(Runtime& rt, const Tensor& tensor, std::span<float> data) {
  INFERD_RETURN_IF_ERROR(check_elements("download", tensor, data.size()));
  std::vector<float> staging;
  INFERD_RETURN_IF_ERROR(read_staging(rt, tensor, staging));
  from_staging(tensor.desc(), staging, data);
  return Status::ok();
}

Status upload_enqueued(Runtime& rt, Tensor& tensor, std::span<const float> data, TransferStaging& staging) {
  INFERD_RETURN_IF_ERROR(check_elements("upload", tensor, data.size()));
  staging.floats = to_staging(tensor.desc(), data);
  if (tensor.desc().data_type() == DataType::kFloat32) {
    return transfer_raw(rt, tensor, staging.floats.data(), false, Transfer::kEnqueue);
  }
  staging.halves.resize(staging.floats.size());
  kernels::fp32_to_fp16_row(staging.floats.data(), staging.halves.data(), static_cast<int64_t>(staging.halves.size()));
  return transfer_raw(rt, tensor, staging.halves.data(), false, Transfer::kEnqueue);
}

Status download_enqueued(Runtime& rt, const Tensor& tensor, TransferStaging& staging) {
  const TensorDescriptor& desc = tensor.desc();
  const size_t n = static_cast<size_t>(desc.stored_texels()) * 4;
  if (desc.data_type() == DataType::kFloat32) {
    staging.floats.resize(n);
    return transfer_raw(rt, tensor, staging.floats.data(), true, Transfer::kEnqueue);
  }
  staging.halves.resize(n);
  return transfer_raw(rt, tensor, staging.halves.data(), true, Transfer::kEnqueue);
}

Status download_finished(const Tensor& tensor, TransferStaging& staging, std::span<float> data) {
  const TensorDescriptor& desc = tensor.desc();
  INFERD_RETURN_IF_ERROR(check_elements("download", tensor, data.size()));
  staged_floats(desc, staging);
  from_staging(desc, staging.floats, data);
  return Status::ok();
}

Result<std::vector<float>> download_texels(Runtime& rt, const Tensor& tensor) {
  std::vector<float> staging;
  INFERD_RETURN_IF_ERROR(read_staging(rt, tensor, staging));
  const TensorDescriptor& desc = tensor.desc();
  if (desc.storage() != StorageType::kTexture2D && desc.storage() != StorageType::kTexture2DSplit) return staging;
  const Bhwc& s = desc.shape();
  std::vector<float> linear(static_cast<size_t>(desc.texel_count()) * 4);
  for (int32_t b = 0; b < s.b; ++b) {
    for (int32_t y = 0; y < s.h; ++y) {
      for (int32_t x = 0; x < s.w; ++x) {
        for (int32_t sl = 0; sl < desc.slices(); ++sl) {
          std::memcpy(&linear[static_cast<size_t>(desc.linear_index(b, x, y, sl) * 4)],
                      &staging[static_cast<size_t>(desc.staging_index(b, x, y, sl) * 4)], 16);
        }
      }
    }
  }
  return linear;
}

Status fill(Runtime& rt, Tensor& tensor, float value) {
  const TensorDescriptor& desc = tensor.desc();
  if (is_texture(desc.storage())) {
    const float color[4] = {value, value, value, value};  // converted to the image's channel type
    const Rect box = texture_region(desc);
    const size_t origin[3] = {0, 0, 0};
    const size_t region[3] = {box.w, box.h, box.d};
    for (int32_t p = 0; p < tensor.desc().parts(); ++p) {
      const cl_mem part = tensor.memory(p);
      INFERD_CL_RETURN_IF_ERROR(clEnqueueFillImage(rt.queue(), part, color, origin, region, 0, nullptr, nullptr));
    }
  } else {
    INFERD_RETURN_IF_ERROR(fill_elements(rt, tensor.buffer(), desc.data_type(), value, 0, desc.data_bytes()));
  }
  return rt.finish();
}

namespace {

// A guard rectangle of a texture as host elements of its data type, every one holding `value`.
std::vector<uint8_t> guard_pixels(DataType type, const Rect& r, float value) {
  const size_t n = r.texels() * 4, size = element_bytes(type);
  const uint32_t bits = element_bits(type, value);
  std::vector<uint8_t> bytes(n * size);
  for (size_t i = 0; i < n; ++i) std::memcpy(&bytes[i * size], &bits, size);  // little-endian host
  return bytes;
}

}  // namespace

Status fill_guards(Runtime& rt, Tensor& tensor, float value) {
  if (tensor.guard_texels() == 0) return Status::ok();
  const DataType type = tensor.desc().data_type();
  if (is_texture(tensor.storage())) {
    for (int32_t p = 0; p < tensor.desc().parts(); ++p) {
      const cl_mem part = tensor.memory(p);
      for (const Rect& r : texture_guards(tensor)) {
        std::vector<uint8_t> pixels = guard_pixels(type, r, value);
        INFERD_RETURN_IF_ERROR(copy_box(rt, part, r, tensor.desc().texel_bytes(), pixels.data(), false));
      }
    }
    return Status::ok();
  }
  // Linear storages: the regions of guard_parent() before and after the data.
  const size_t after = tensor.guard_before_bytes() + tensor.desc().data_bytes();
  if (tensor.guard_before_bytes() > 0) {
    INFERD_RETURN_IF_ERROR(fill_elements(rt, tensor.guard_parent(), type, value, 0, tensor.guard_before_bytes()));
  }
  INFERD_RETURN_IF_ERROR(fill_elements(rt, tensor.guard_parent(), type, value, after, tensor.guard_after_bytes()));
  return rt.finish();
}

Status check_guards(Runtime& rt, const Tensor& tensor, float value) {
  if (tensor.guard_texels() == 0) return Status::ok();
  const DataType type = tensor.desc().data_type();
  const size_t size = element_bytes(type);
  const uint32_t expected = element_bits(type, value);
  auto check = [&](const std::vector<uint8_t>& got, const char* where) -> Status {
    for (size_t i = 0; i < got.size() / size; ++i) {
      uint32_t bits = 0;
      std::memcpy(&bits, &got[i * size], size);
      if (bits != expected) {
        return make_error(Code::kCorrupt, "%s: guard overwritten %s (element %zu holds bits 0x%x)",
                          tensor.desc().to_string().c_str(), where, i, bits);
      }
    }
    return Status::ok();
  };
  if (is_texture(tensor.storage())) {
    const char* where[] = {"in the columns right of the data", "in the rows below the data",
                           "in the slices behind the data"};
    for (int32_t p = 0; p < tensor.desc().parts(); ++p) {
      const cl_mem part = tensor.memory(p);
      int i = 0;
      for (const Rect& r : texture_guards(tensor)) {
        std::vector<uint8_t> got(r.texels() * tensor.desc().texel_bytes());
        INFERD_RETURN_IF_ERROR(copy_box(rt, part, r, tensor.desc().texel_bytes(), got.data(), true));
        INFERD_RETURN_IF_ERROR(check(got, where[i++]));
      }
    }
    return Status::ok();
  }
  std::vector<uint8_t> got(tensor.guard_before_bytes());
  if (!got.empty()) {
    INFERD_RETURN_IF_ERROR(rt.read_buffer(tensor.guard_parent(), 0, tensor.guard_before_bytes(), got.data()));
    INFERD_RETURN_IF_ERROR(check(got, "before the data"));
  }
  got.resize(tensor.guard_after_bytes());
  INFERD_RETURN_IF_ERROR(rt.read_buffer(tensor.guard_parent(), tensor.guard_before_bytes() + tensor.desc().data_bytes(),
                                        tensor.guard_after_bytes(), got.data()));
  return check(got, "after the data");
}

}  // namespace inferd::opencl
