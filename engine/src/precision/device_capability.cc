#include "precision/device_capability.h"

#include <ATen/ops/ones.h>
#include <dlfcn.h>

#include <fstream>
#include <map>
#include <mutex>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "engine/precision_context.h"

namespace engine {
namespace {

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      size_t colon = line.find(':');
      if (colon != std::string::npos) {
        size_t start = line.find_first_not_of(' ', colon + 1);
        return start == std::string::npos ? "" : line.substr(start);
      }
    }
  }
  return "CPU";
}

// Runs a small matrix product in `dtype` on `device`; false when LibTorch refuses.
bool MatmulRuns(c10::Device device, at::ScalarType dtype) {
  try {
    at::Tensor a = at::ones({4, 4}, at::TensorOptions().dtype(dtype).device(device));
    return a.matmul(a).scalar_type() == dtype;
  } catch (...) {
    return false;
  }
}

// Whether autocast on `device` can target `dtype`, and a product under it comes out in `dtype`.
bool AutocastRuns(c10::Device device, at::ScalarType dtype) {
  try {
    auto scope = PrecisionContext::Autocast(device.type(), dtype).Enter();
    at::Tensor a = at::ones({4, 4}, at::TensorOptions().dtype(at::kFloat).device(device));
    return a.matmul(a).scalar_type() == dtype;
  } catch (...) {
    return false;
  }
}

// The CUDA driver's view of a device, through libcuda (loaded only when needed).
bool CudaComputeCapability(int index, int* capability, std::string* name) {
  void* driver = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver == nullptr) return false;
  using InitFn = int (*)(unsigned int);
  using GetFn = int (*)(int*, int);
  using AttributeFn = int (*)(int*, int, int);
  using NameFn = int (*)(char*, int, int);
  auto init = reinterpret_cast<InitFn>(::dlsym(driver, "cuInit"));
  auto get = reinterpret_cast<GetFn>(::dlsym(driver, "cuDeviceGet"));
  auto attribute = reinterpret_cast<AttributeFn>(::dlsym(driver, "cuDeviceGetAttribute"));
  auto get_name = reinterpret_cast<NameFn>(::dlsym(driver, "cuDeviceGetName"));
  if (!init || !get || !attribute || init(0) != 0) return false;
  int device = 0, major = 0, minor = 0;
  constexpr int kMajor = 75, kMinor = 76;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR/MINOR
  if (get(&device, index) != 0 || attribute(&major, kMajor, device) != 0 ||
      attribute(&minor, kMinor, device) != 0) {
    return false;
  }
  *capability = major * 10 + minor;
  char buffer[256] = {0};
  if (get_name && get_name(buffer, sizeof(buffer) - 1, device) == 0) *name = buffer;
  return true;
}

DeviceCapability Probe(const std::string& device_name) {
  DeviceCapability cap;
  cap.device = device_name;
  const c10::Device device(device_name);
  if (device.is_cuda()) {
    cap.cuda = true;
    cap.name = "CUDA device";
    CudaComputeCapability(device.index() < 0 ? 0 : device.index(), &cap.compute_capability,
                          &cap.name);
    cap.fp16 = MatmulRuns(device, at::kHalf);
    cap.fp16_autocast = AutocastRuns(device, at::kHalf);
    // Before sm_80 LibTorch may emulate bf16 products; that is not bf16 support for training.
    cap.bf16 = cap.compute_capability >= 80 && MatmulRuns(device, at::kBFloat16);
    cap.bf16_fast = cap.bf16;
    cap.bf16_autocast = cap.bf16 && AutocastRuns(device, at::kBFloat16);
    return cap;
  }
  cap.name = CpuModelName();
  std::string flag;
  cap.bf16_fast = CpuHasBf16Hardware(&flag);
  if (!flag.empty()) cap.name += " (" + flag + ")";
  cap.bf16 = MatmulRuns(device, at::kBFloat16);
  cap.fp16 = MatmulRuns(device, at::kHalf);
  cap.bf16_autocast = AutocastRuns(device, at::kBFloat16);
  cap.fp16_autocast = AutocastRuns(device, at::kHalf);
  cap.bf16_fast = cap.bf16_fast && cap.bf16;
  return cap;
}

}  // namespace

bool CpuHasBf16Hardware(std::string* flag) {
#if defined(__x86_64__) || defined(__i386__)
  unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (edx & (1u << 22))) {
    *flag = "amx_bf16";
    return true;
  }
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 5))) {
    *flag = "avx512_bf16";
    return true;
  }
#endif
  flag->clear();
  return false;
}

bool CpuHasFp16Hardware() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (edx & (1u << 23))) return true;
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 21))) return true;
#endif
  return false;
}

Status CheckDeviceUsable(const std::string& device) {
  std::string reason;
  try {
    const at::Tensor probe = at::ones({16}, at::TensorOptions().device(c10::Device(device)));
    if (probe.sum().item<double>() == 16) return Status::Ok();
    reason = "a sum computed there came out wrong";
  } catch (const std::exception& e) {
    reason = e.what();
    if (const size_t end = reason.find('\n'); end != std::string::npos) reason.resize(end);
  }
  return FailedPreconditionError(
      "device " + device + " cannot be used: " + reason +
      (device.rfind("cuda", 0) == 0
           ? "; if another process holds it (a GPU in exclusive-process compute mode serves one "
             "process only), end that process or choose other devices with CUDA_VISIBLE_DEVICES"
           : ""));
}

DeviceCapability ProbeDevice(const std::string& device) {
  static std::mutex mu;
  static auto* cache = new std::map<std::string, DeviceCapability>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(device);
  if (it != cache->end()) return it->second;
  DeviceCapability cap = Probe(device);
  cache->emplace(device, cap);
  return cap;
}

std::string DeviceCapability::Describe() const {
  std::string out = device + " " + name;
  if (cuda && compute_capability > 0) out += " (sm_" + std::to_string(compute_capability) + ")";
  return out;
}

}  // namespace engine
