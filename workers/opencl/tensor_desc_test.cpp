// Tests of tensor virtualization: the physical layouts (pure), the storage chooser on synthetic
// devices (pure), then allocation, transfers, padding and guards on a real device.
#include "inferd/opencl/tensor_desc.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <random>

#include "inferd/kernels/cpu.h"
#include "test_device.h"

namespace inferd::opencl {
namespace {

// The parts of the split textures in these tests: 3, so that the slices (2 to 144) split unevenly.
constexpr int32_t kTestParts = 3;

TEST(TensorDesc, SlicesAndLayouts) {
  EXPECT_EQ((Bhwc{1, 1, 1, 1}).slices(), 1);
  EXPECT_EQ((Bhwc{1, 1, 1, 4}).slices(), 1);
  EXPECT_EQ((Bhwc{1, 1, 1, 5}).slices(), 2);
  EXPECT_EQ((Bhwc{1, 1, 1, 67}).slices(), 17);
  EXPECT_EQ((Bhwc{1, 1, 1, 576}).slices(), 144);

  const TensorDescriptor buffer(Bhwc{2, 3, 5, 7}, StorageType::kBuffer);  // S = 2
  EXPECT_EQ(buffer.texel_count(), 2 * 3 * 5 * 2);
  EXPECT_EQ(buffer.data_bytes(), 60u * 16);
  // ((s*H + y)*W + x)*B + b
  EXPECT_EQ(buffer.linear_index(0, 0, 0, 0), 0);
  EXPECT_EQ(buffer.linear_index(1, 0, 0, 0), 1);
  EXPECT_EQ(buffer.linear_index(0, 1, 0, 0), 2);
  EXPECT_EQ(buffer.linear_index(0, 0, 1, 0), 10);
  EXPECT_EQ(buffer.linear_index(0, 0, 0, 1), 30);
  EXPECT_EQ(buffer.linear_index(1, 4, 2, 1), ((1 * 3 + 2) * 5 + 4) * 2 + 1);
  EXPECT_EQ(buffer.staging_index(1, 4, 2, 1), buffer.linear_index(1, 4, 2, 1));

  // Texture: (x*B + b, y*S + s) in an image of (W*B) x (H*S), staged row-major.
  const TensorDescriptor texture(Bhwc{2, 3, 5, 7}, StorageType::kTexture2D);
  EXPECT_EQ(texture.texture_width(), 10);
  EXPECT_EQ(texture.texture_height(), 6);
  EXPECT_EQ(texture.staging_index(1, 4, 2, 1), (2 * 2 + 1) * 10 + 4 * 2 + 1);
  EXPECT_EQ(texture.staging_index(0, 0, 0, 1), 10);

  // 3D texture: (x*B + b, y, s) in an image of (W*B) x H x S, whose row-major order is the linear one.
  const TensorDescriptor volume(Bhwc{2, 3, 5, 7}, StorageType::kTexture3D);
  EXPECT_EQ(volume.texture_width(), 10);
  EXPECT_EQ(volume.texture_height(), 3);
  EXPECT_EQ(volume.texture_depth(), 2);
  EXPECT_EQ(texture.texture_depth(), 1);
  EXPECT_EQ(volume.staging_index(1, 4, 2, 1), (1 * 3 + 2) * 10 + 4 * 2 + 1);
  EXPECT_EQ(volume.staging_index(1, 4, 2, 1), volume.linear_index(1, 4, 2, 1));

  // Split 2D texture: 17 slices in 3 parts of Sp = 6 slices, each (W*B) x (H*Sp), the parts in a row.
  const TensorDescriptor split(Bhwc{2, 3, 5, 67}, StorageType::kTexture2DSplit, DataType::kFloat32, 3);
  EXPECT_EQ(split.parts(), 3);
  EXPECT_EQ(split.part_slices(), 6);
  EXPECT_EQ(split.texture_width(), 10);
  EXPECT_EQ(split.texture_height(), 18);
  EXPECT_EQ(split.stored_texels(), 3 * 10 * 18);
  EXPECT_EQ(split.data_bytes(), size_t{3 * 10 * 18 * 16});
  EXPECT_EQ(split.staging_index(1, 4, 2, 13), ((2 * 3 + 2) * 6 + 1) * 10 + 4 * 2 + 1);  // part 2, slice 1
  EXPECT_EQ(split.to_string(), "2x3x5x67 texture2d_split[3]");
  // Parts are clamped to the slices and no part is left empty: 5 slices in 4 parts are 3 of 2.
  EXPECT_EQ(TensorDescriptor(Bhwc{1, 1, 1, 20}, StorageType::kTexture2DSplit, DataType::kFloat32, 4).parts(), 3);
  EXPECT_EQ(TensorDescriptor(Bhwc{1, 1, 1, 3}, StorageType::kTexture2DSplit, DataType::kFloat32, 4).parts(), 1);
  EXPECT_EQ(TensorFormat(StorageType::kBuffer, DataType::kFloat32, 4).parts, 1);
}

DeviceInfo fake_gpu() {
  DeviceInfo d;
  d.name = "fake gpu";
  d.type = DeviceType::kGpu;
  d.max_alloc_bytes = uint64_t{1} << 30;
  d.image_support = true;
  d.image2d_max_width = 16384;
  d.image2d_max_height = 16384;
  d.image3d_max_width = d.image3d_max_height = d.image3d_max_depth = 2048;
  d.extensions = {"cl_khr_3d_image_writes"};
  d.image_max_buffer_size = 1 << 27;
  return d;
}

TEST(StorageChooser, GpuPrefersTexturesWithinTheirLimits) {
  const DeviceInfo gpu = fake_gpu();
  auto hidden = choose_storage(gpu, Bhwc{1, 1, 512, 896});
  ASSERT_TRUE(hidden.is_ok());
  EXPECT_EQ(hidden->storage, StorageType::kTexture2D);
  EXPECT_TRUE(hidden->fallbacks.empty());

  // Logits of a 151936-token vocabulary: 37984 slices are taller than the 2D texture and deeper than
  // the 3D one, and fit three 2D textures.
  auto logits = choose_storage(gpu, Bhwc{1, 1, 1, 151936});
  ASSERT_TRUE(logits.is_ok());
  EXPECT_EQ(logits->storage, StorageType::kTexture2DSplit) << logits->to_string();
  EXPECT_EQ(logits->parts, 3);
  ASSERT_EQ(logits->fallbacks.size(), 2u);
  EXPECT_EQ(logits->fallbacks[0], "texture2d: height 37984 > CL_DEVICE_IMAGE2D_MAX_HEIGHT 16384");
  EXPECT_EQ(logits->fallbacks[1], "texture3d: depth 37984 > CL_DEVICE_IMAGE3D_MAX_DEPTH 2048");
  EXPECT_NE(logits->to_string().find("passed over texture2d"), std::string::npos);

  // Attention scores of 14 heads over 4096 positions on a device whose 2D textures are 8192 tall:
  // H*S = 14336 rows do not fit, but 14 rows of 1024 slices deep do.
  DeviceInfo short_2d = gpu;
  short_2d.image2d_max_height = 8192;
  auto scores = choose_storage(short_2d, Bhwc{1, 14, 1, 4096});
  ASSERT_TRUE(scores.is_ok());
  EXPECT_EQ(scores->storage, StorageType::kTexture3D);
  ASSERT_EQ(scores->fallbacks.size(), 1u);
  // ... unless the device cannot write 3D images: named, then two 2D textures of 512 slices each.
  short_2d.extensions.clear();
  scores = choose_storage(short_2d, Bhwc{1, 14, 1, 4096});
  ASSERT_TRUE(scores.is_ok());
  EXPECT_EQ(scores->storage, StorageType::kTexture2DSplit);
  EXPECT_EQ(scores->parts, 2);
  ASSERT_EQ(scores->fallbacks.size(), 2u);
  EXPECT_EQ(scores->fallbacks[1], "texture3d: the device lacks cl_khr_3d_image_writes");
  EXPECT_EQ(scores->to_string().substr(0, 19), "texture2d_split[2] ");

  // Wider than the texture and longer than an image buffer: a plain buffer.
  DeviceInfo small_buffers = gpu;
  small_buffers.image_max_buffer_size = 1 << 18;
  auto huge = choose_storage(small_buffers, Bhwc{1, 1, 20000, 64});
  ASSERT_TRUE(huge.is_ok());
  EXPECT_EQ(huge->storage, StorageType::kBuffer);
  ASSERT_EQ(huge->fallbacks.size(), 4u);
  EXPECT_NE(huge->fallbacks[0].find("CL_DEVICE_IMAGE2D_MAX_WIDTH"), std::string::npos);
  EXPECT_NE(huge->fallbacks[1].find("CL_DEVICE_IMAGE3D_MAX_WIDTH"), std::string::npos);
  EXPECT_NE(huge->fallbacks[2].find("texture2d_split"), std::string::npos);
  EXPECT_NE(huge->fallbacks[2].find("CL_DEVICE_IMAGE2D_MAX_WIDTH"), std::string::npos);
  EXPECT_NE(huge->fallbacks[3].find("CL_DEVICE_IMAGE_MAX_BUFFER_SIZE"), std::string::npos);
}

// Tensors sharing one storage: the first storage that holds every one, a split in as many parts as
// the most demanding needs.
TEST(StorageChooser, OneStorageForSeveralTensors) {
  const TensorSpec tensors[] = {{Bhwc{1, 1, 1, 40000}, DataType::kFloat16}, {Bhwc{1, 1, 1, 80000}, DataType::kFloat32}};
  auto c = choose_storage(fake_gpu(), tensors);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->storage, StorageType::kTexture2DSplit);
  EXPECT_EQ(c->parts, 2);
  ASSERT_EQ(c->fallbacks.size(), 2u);
  EXPECT_EQ(c->fallbacks[0], "texture2d: height 20000 > CL_DEVICE_IMAGE2D_MAX_HEIGHT 16384");
  // Alone, the first fits a 2D texture.
  EXPECT_EQ(choose_storage(fake_gpu(), tensors[0].shape, kAnyStorage, DataType::kFloat16)->storage,
            StorageType::kTexture2D);
}

TEST(StorageChooser, HonoursWhatTheKernelSupports) {
  auto c = choose_storage(fake_gpu(), Bhwc{1, 1, 4, 64},
                          storage_bit(StorageType::kBuffer) | storage_bit(StorageType::kImageBuffer));
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->storage, StorageType::kImageBuffer);
  ASSERT_EQ(c->fallbacks.size(), 3u);
  EXPECT_EQ(c->fallbacks[0], "texture2d: not supported by the kernel");
  EXPECT_EQ(c->fallbacks[1], "texture3d: not supported by the kernel");
  EXPECT_EQ(c->fallbacks[2], "texture2d_split: not supported by the kernel");
}

TEST(StorageChooser, DevicesWithoutImagesUseBuffers) {
  DeviceInfo gpu = fake_gpu();
  gpu.image_support = false;
  auto c = choose_storage(gpu, Bhwc{1, 1, 4, 64});
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->storage, StorageType::kBuffer);
  ASSERT_EQ(c->fallbacks.size(), 4u);
  EXPECT_EQ(c->fallbacks[0], "texture2d: the device has no images");
  EXPECT_EQ(c->fallbacks[1], "texture3d: the device has no images");
  EXPECT_EQ(TensorDescriptor(Bhwc{1, 1, 4, 64}, StorageType::kImageBuffer).fits(gpu).code(), Code::kUnimplemented);
}

TEST(StorageChooser, CpuDevicesPreferBuffers) {
  DeviceInfo cpu = fake_gpu();
  cpu.type = DeviceType::kCpu;
  auto c = choose_storage(cpu, Bhwc{1, 1, 4, 64});
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->storage, StorageType::kBuffer);
  EXPECT_TRUE(c->fallbacks.empty());
}

TEST(StorageChooser, NothingFitsIsAnError) {
  DeviceInfo gpu = fake_gpu();
  gpu.max_alloc_bytes = 1024;
  auto c = choose_storage(gpu, Bhwc{1, 1, 100000, 64});
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), Code::kOutOfRange);
  EXPECT_NE(c.status().message().find("CL_DEVICE_MAX_MEM_ALLOC_SIZE"), std::string::npos) << c.status().message();
}

// The storages a measurement times: one texture (the first that holds the tensors), the image buffer
// and the buffer, in the device's order, each only where it fits.
TEST(StorageCandidates, OneTextureThenImageBufferThenBuffer) {
  auto names = [](const std::vector<StorageChoice>& cs) {
    std::string text;
    for (const StorageChoice& c : cs) {
      if (!text.empty()) text += ' ';
      text += TensorFormat(c.storage, DataType::kFloat32, c.parts).to_string();
      EXPECT_TRUE(c.fallbacks.empty());
    }
    return text;
  };
  const TensorSpec hidden[] = {{Bhwc{1, 1, 512, 896}, DataType::kFloat32}};
  EXPECT_EQ(names(storage_candidates(fake_gpu(), hidden)), "texture2d image_buffer buffer");
  // Too tall for a 2D texture and too deep for a 3D one: the split stands for the textures.
  const TensorSpec wide[] = {{Bhwc{1, 1, 1, 151936}, DataType::kFloat32}};
  EXPECT_EQ(names(storage_candidates(fake_gpu(), wide)), "texture2d_split[3] image_buffer buffer");
  // Longer than an image buffer.
  DeviceInfo small_buffers = fake_gpu();
  small_buffers.image_max_buffer_size = 1 << 10;
  EXPECT_EQ(names(storage_candidates(small_buffers, hidden)), "texture2d buffer");
  DeviceInfo no_images = fake_gpu();
  no_images.image_support = false;
  EXPECT_EQ(names(storage_candidates(no_images, hidden)), "buffer");
  DeviceInfo cpu = fake_gpu();
  cpu.type = DeviceType::kCpu;
  EXPECT_EQ(names(storage_candidates(cpu, hidden)), "buffer image_buffer texture2d");
  no_images.max_alloc_bytes = 1024;
  EXPECT_TRUE(storage_candidates(no_images, hidden).empty());
}

// ---- On a device ----------------------------------------------------------------------------------

std::vector<float> random_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// Every storage: the data comes back unchanged, every texel sits where the layout table says, and
// the padding lanes are zero.
TEST(TensorDevice, UploadDownloadRoundTripsInEveryStorage) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  const Bhwc shapes[] = {{1, 1, 1, 1}, {1, 1, 7, 3}, {2, 3, 5, 5}, {1, 2, 3, 67}, {1, 1, 2, 576}};
  for (StorageType storage : kAllStorageTypes) {
    for (const Bhwc& shape : shapes) {
      SCOPED_TRACE(std::string(storage_name(storage)) + " " + shape.to_string());
      const TensorDescriptor desc(shape, storage, DataType::kFloat32, kTestParts);
      if (!desc.fits(rt->info())) continue;
      auto tensor = Tensor::allocate(*rt, desc);
      ASSERT_TRUE(tensor.is_ok()) << tensor.status().to_string();
      const std::vector<float> data = random_values(shape.elements(), 7);
      ASSERT_TRUE(upload(*rt, tensor.value(), data).is_ok());
      std::vector<float> back(data.size(), -1.0f);
      ASSERT_TRUE(download(*rt, tensor.value(), back).is_ok());
      EXPECT_EQ(back, data);

      auto texels = download_texels(*rt, tensor.value());
      ASSERT_TRUE(texels.is_ok()) << texels.status().to_string();
      ASSERT_EQ(texels->size(), static_cast<size_t>(desc.texel_count() * 4));
      for (int32_t b = 0; b < shape.b; ++b) {
        for (int32_t y = 0; y < shape.h; ++y) {
          for (int32_t x = 0; x < shape.w; ++x) {
            for (int32_t c = 0; c < desc.slices() * 4; ++c) {
              const float got = (*texels)[static_cast<size_t>(desc.linear_index(b, x, y, c / 4) * 4 + c % 4)];
              const float want = c < shape.c ? data[static_cast<size_t>(shape.offset(b, x, y, c))] : 0.0f;
              ASSERT_EQ(got, want) << "b=" << b << " x=" << x << " y=" << y << " c=" << c;
            }
          }
        }
      }
    }
  }
}

// A half tensor takes 8 bytes a texel and holds each value rounded to the nearest half (ties to
// even): what comes back is the host's fp32_to_fp16 of what went in, in every storage; the padding
// lanes are zero; fill and the guards work in halves.
TEST(TensorDevice, HalfTensorsHoldHalvesInEveryStorage) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  const Bhwc shapes[] = {{1, 1, 1, 1}, {2, 3, 5, 5}, {1, 1, 2, 576}};
  const float kSentinel = -1234.0f;  // a half exactly (its spacing is 1 in [1024, 2048))
  for (StorageType storage : kAllStorageTypes) {
    for (const Bhwc& shape : shapes) {
      SCOPED_TRACE(std::string(storage_name(storage)) + " " + shape.to_string());
      const TensorDescriptor desc(shape, storage, DataType::kFloat16, kTestParts);
      EXPECT_EQ(desc.data_bytes(), static_cast<size_t>(desc.texel_count()) * 8);
      EXPECT_EQ(desc.to_string(), shape.to_string() + " " + desc.format().to_string());
      EXPECT_EQ(desc.format().to_string().substr(desc.format().to_string().size() - 5), "(f16)");
      if (!desc.fits(rt->info())) continue;
      auto tensor = Tensor::allocate(*rt, desc, AllocOptions{3});
      ASSERT_TRUE(tensor.is_ok()) << tensor.status().to_string();
      Tensor& t = tensor.value();
      ASSERT_TRUE(fill_guards(*rt, t, kSentinel).is_ok());
      std::vector<float> data = random_values(shape.elements(), 11);
      // Halfway between two halves (their spacing is 2^-10 in [1, 2)): ties go to the even one.
      data[0] = 1.0f + 1.0f / 2048.0f;  // between 1 and 1 + 2^-10: to 1
      if (data.size() > 1) data[1] = 1.0f + 3.0f / 2048.0f;  // between 1 + 2^-10 and 1 + 2^-9: to 1 + 2^-9
      ASSERT_TRUE(upload(*rt, t, data).is_ok());
      std::vector<float> back(data.size(), -1.0f);
      ASSERT_TRUE(download(*rt, t, back).is_ok());
      EXPECT_EQ(back[0], 1.0f);
      if (data.size() > 1) {
        EXPECT_EQ(back[1], 1.0f + 1.0f / 512.0f);
      }
      for (size_t i = 0; i < data.size(); ++i) {
        ASSERT_EQ(back[i], kernels::fp16_to_fp32(kernels::fp32_to_fp16(data[i]))) << i;
      }
      auto texels = download_texels(*rt, t);
      ASSERT_TRUE(texels.is_ok());
      for (int32_t b = 0; b < shape.b; ++b) {
        for (int32_t y = 0; y < shape.h; ++y) {
          for (int32_t x = 0; x < shape.w; ++x) {
            for (int32_t c = shape.c; c < desc.slices() * 4; ++c) {
              ASSERT_EQ((*texels)[static_cast<size_t>(desc.linear_index(b, x, y, c / 4) * 4 + c % 4)], 0.0f);
            }
          }
        }
      }
      EXPECT_TRUE(check_guards(*rt, t, kSentinel).is_ok());
      ASSERT_TRUE(fill(*rt, t, 0.1f).is_ok());
      ASSERT_TRUE(download(*rt, t, back).is_ok());
      for (float v : back) ASSERT_EQ(v, kernels::fp16_to_fp32(kernels::fp32_to_fp16(0.1f)));
      EXPECT_TRUE(check_guards(*rt, t, kSentinel).is_ok());
      // A view keeps the data type.
      auto view = t.view(Bhwc{shape.b, shape.h, 1, shape.c});
      ASSERT_TRUE(view.is_ok());
      EXPECT_EQ(view->format(), desc.format());
    }
  }
}

TEST(TensorDevice, FillSetsEveryTexel) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  for (StorageType storage : kAllStorageTypes) {
    const TensorDescriptor desc(Bhwc{1, 2, 3, 5}, storage, DataType::kFloat32, kTestParts);
    if (!desc.fits(rt->info())) continue;
    auto tensor = Tensor::allocate(*rt, desc);
    ASSERT_TRUE(tensor.is_ok()) << tensor.status().to_string();
    ASSERT_TRUE(fill(*rt, tensor.value(), NAN).is_ok());
    auto texels = download_texels(*rt, tensor.value());
    ASSERT_TRUE(texels.is_ok());
    for (float v : texels.value()) ASSERT_TRUE(std::isnan(v)) << storage_name(storage);
  }
}

// Guards hold their sentinel until something writes past the data; check_guards() then names it.
TEST(TensorDevice, GuardsCatchOutOfBoundsWrites) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  const float kSentinel = -12345.5f;
  std::vector<TensorFormat> formats;
  for (DataType type : kAllDataTypes) {
    for (StorageType storage : kAllStorageTypes) formats.emplace_back(storage, type, kTestParts);
  }
  for (const TensorFormat& format : formats) {
    SCOPED_TRACE(format.to_string());
    const StorageType storage = format.storage;
    const TensorDescriptor desc(Bhwc{1, 2, 3, 5}, format);
    if (!desc.fits(rt->info())) continue;
    auto tensor = Tensor::allocate(*rt, desc, AllocOptions{4});
    ASSERT_TRUE(tensor.is_ok()) << tensor.status().to_string();
    Tensor& t = tensor.value();
    ASSERT_TRUE(fill_guards(*rt, t, kSentinel).is_ok());
    std::vector<float> data = random_values(desc.shape().elements(), 3);
    for (float& v : data) v = std::round(v * 64.0f) / 64.0f;  // exact in half and in float
    ASSERT_TRUE(upload(*rt, t, data).is_ok());
    EXPECT_TRUE(check_guards(*rt, t, kSentinel).is_ok());
    std::vector<float> back(data.size());
    ASSERT_TRUE(download(*rt, t, back).is_ok());
    EXPECT_EQ(back, data);

    // One texel just past the data.
    const float bad[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    if (is_texture(storage)) {
      const size_t origin[3] = {static_cast<size_t>(desc.texture_width()), 0, 0};
      const size_t region[3] = {1, 1, 1};
      ASSERT_EQ(clEnqueueWriteImage(rt->queue(), t.memory(), CL_TRUE, origin, region, 0, 0, bad, 0, nullptr, nullptr),
                CL_SUCCESS);
    } else {
      ASSERT_TRUE(rt->write_buffer(t.guard_parent(), t.guard_before_bytes() + desc.data_bytes(), sizeof(bad), bad).is_ok());
    }
    const Status s = check_guards(*rt, t, kSentinel);
    EXPECT_EQ(s.code(), Code::kCorrupt);
    EXPECT_NE(s.message().find("guard overwritten"), std::string::npos) << s.message();
  }
}

TEST(TensorDevice, RejectsMismatchedTransfers) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  auto tensor = Tensor::allocate(*rt, TensorDescriptor(Bhwc{1, 1, 2, 3}, StorageType::kBuffer));
  ASSERT_TRUE(tensor.is_ok());
  std::vector<float> wrong(5);
  EXPECT_EQ(upload(*rt, tensor.value(), wrong).code(), Code::kInvalidArgument);
  EXPECT_EQ(download(*rt, tensor.value(), wrong).code(), Code::kInvalidArgument);
}

// A view of fewer tokens reads and writes the parent's memory in its own layout, in every storage;
// the parent outlives nothing it shares (the view keeps the objects alive); bad shapes are errors.
TEST(TensorDevice, ViewsOfFewerTokensShareTheMemory) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  for (StorageType storage : kAllStorageTypes) {
    const TensorDescriptor desc(Bhwc{1, 1, 8, 7}, storage, DataType::kFloat32, kTestParts);
    if (!desc.fits(rt->info())) continue;
    std::optional<Tensor> view;
    {
      auto parent = Tensor::allocate(*rt, desc);
      ASSERT_TRUE(parent.is_ok()) << parent.status().to_string();
      auto v = parent->view(Bhwc{1, 1, 3, 7});
      ASSERT_TRUE(v.is_ok()) << v.status().to_string();
      view.emplace(std::move(v).value());
      EXPECT_EQ(view->storage(), storage);
      EXPECT_EQ(view->shape(), (Bhwc{1, 1, 3, 7}));
      EXPECT_EQ(parent->view(Bhwc{1, 1, 9, 7}).status().code(), Code::kInvalidArgument);  // wider
      EXPECT_EQ(parent->view(Bhwc{1, 1, 3, 8}).status().code(), Code::kInvalidArgument);  // other channels
      EXPECT_EQ(parent->view(Bhwc{1, 2, 3, 7}).status().code(), Code::kInvalidArgument);  // other height
      // The parent sees what is written through the view: its first texel is the view's first.
      ASSERT_TRUE(fill(*rt, parent.value(), 0.0f).is_ok());
      const std::vector<float> data = random_values(21, 9);
      ASSERT_TRUE(upload(*rt, *view, data).is_ok());
      auto texels = download_texels(*rt, parent.value());
      ASSERT_TRUE(texels.is_ok());
      EXPECT_EQ((*texels)[0], data[0]) << storage_name(storage);
    }
    // The parent is gone; the view still works.
    const std::vector<float> data = random_values(21, 10);
    ASSERT_TRUE(upload(*rt, *view, data).is_ok());
    std::vector<float> back(data.size());
    ASSERT_TRUE(download(*rt, *view, back).is_ok());
    EXPECT_EQ(back, data) << storage_name(storage);
  }
}

}  // namespace
}  // namespace inferd::opencl
