// The native lane: eager calls of a tk op replayed from C++.
//
// A tk op's body is Python: it checks its arguments, allocates its outputs
// and launches Triton kernels.  For a small tensor that Python costs more
// than the kernel runs.  But what the body does is decided by the
// *metadata* of its arguments (dtypes, shapes, strides, devices, pointer
// alignment, the non-tensor arguments), never by the values in the tensors.
// So the first calls with a given metadata run the body while ops/_native.py
// records what it did (the outputs it allocated, each launch: binary, grid,
// and every argument as "input i + offset", "output j + offset", "temporary
// k + offset" or a literal); once two recordings agree, later calls with the
// same metadata skip Python altogether: this kernel, registered at the
// dispatcher's AutogradCUDA and CUDA keys, allocates the outputs and launches
// the recorded binaries through the CUDA driver.
//
// Anything it does not recognise goes to the Python kernel it replaced
// (the fallback): a call that needs a gradient, a traced call (fake or
// functional tensors, a dispatch mode, torch.func), an argument type it does
// not key on, a call whose body could not be recorded.
//
// No CUDA headers: the four driver functions are looked up in libcuda at
// run time, and the current stream comes from c10's device-guard interface,
// so the same file builds on machines without a CUDA toolkit (where tests
// drive it through a launch hook on CPU tensors).

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <dlfcn.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

// ---------------------------------------------------------------------------
// A recorded call.
// ---------------------------------------------------------------------------

enum Source : int64_t { kInput = 0, kOutput = 1, kTemp = 2, kValue = 3 };

struct Param {
  Source source;
  int64_t index;  // which input, output or temporary
  int64_t value;  // byte offset into it, or (kValue) the argument's bits
};

struct Launch {
  uint64_t function;  // a CUfunction, loaded by Triton
  unsigned grid[3];
  unsigned threads;
  unsigned shared;
  std::vector<Param> params;
};

struct Output {
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype;
};

struct Plan {
  c10::Device device{c10::kCPU};
  std::vector<Output> outputs;
  std::vector<int64_t> temps;  // bytes
  std::vector<Launch> launches;
  std::string signature;  // everything above, to compare two recordings
};

constexpr size_t kMaxParams = 64;
constexpr size_t kMaxPlans = 512;  // per op and dispatch key: past this, start over (a shape sweep)
constexpr int kMaxTries = 4;       // recordings per key that may disagree before it stays in Python

// ---------------------------------------------------------------------------
// The CUDA driver, looked up once.
// ---------------------------------------------------------------------------

using LaunchFn = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                         void**, void**);
using CtxGetFn = int (*)(void**);
using CtxSetFn = int (*)(void*);
using RetainFn = int (*)(void**, int);

struct Driver {
  LaunchFn launch = nullptr;
  CtxGetFn ctx_get = nullptr;
  CtxSetFn ctx_set = nullptr;
  RetainFn retain = nullptr;
};

const Driver& driver() {
  static const Driver d = [] {
    Driver found;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == nullptr) return found;
    found.launch = reinterpret_cast<LaunchFn>(dlsym(lib, "cuLaunchKernel"));
    found.ctx_get = reinterpret_cast<CtxGetFn>(dlsym(lib, "cuCtxGetCurrent"));
    found.ctx_set = reinterpret_cast<CtxSetFn>(dlsym(lib, "cuCtxSetCurrent"));
    found.retain = reinterpret_cast<RetainFn>(dlsym(lib, "cuDevicePrimaryCtxRetain"));
    return found;
  }();
  return d;
}

PyObject* launch_hook = nullptr;  // tests: called instead of the driver (owned reference)
std::atomic<bool> enabled{true};   // off: every call goes to the Python kernel, unrecorded

void launch_on_device(const Launch& l, void** params, const c10::Device& device, const char* op) {
  const Driver& d = driver();
  TORCH_CHECK(d.launch != nullptr, "tk.", op, ": the CUDA driver (libcuda.so.1) could not be loaded");
  // A thread that has not touched CUDA through the runtime has no current
  // context; the driver API needs one (the device's primary context).
  void* ctx = nullptr;
  if (d.ctx_get(&ctx) == 0 && ctx == nullptr) {
    TORCH_CHECK(d.retain(&ctx, device.index()) == 0 && d.ctx_set(ctx) == 0, "tk.", op,
                ": could not make device ", device.index(), "'s CUDA context current");
  }
  void* stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device).native_handle();
  int error = d.launch(reinterpret_cast<void*>(l.function), l.grid[0], l.grid[1], l.grid[2], l.threads, 1, 1,
                       l.shared, stream, params, nullptr);
  TORCH_CHECK(error == 0, "tk.", op, ": cuLaunchKernel failed with CUDA error ", error);
}

void launch_through_hook(const Launch& l, const std::vector<uint64_t>& slots) {
  py::gil_scoped_acquire gil;
  py::list values;
  for (uint64_t v : slots) values.append(py::int_(v));
  py::handle hook(launch_hook);
  hook(l.function, py::make_tuple(l.grid[0], l.grid[1], l.grid[2]), l.threads, l.shared, values);
}

// A tensor straight from the device's allocator, as at::empty_strided makes
// one but without a trip through the dispatcher.
at::Tensor allocate(const Output& o, const c10::Device& device) {
  static c10::Allocator* const cuda = [] {
    try {
      return c10::GetAllocator(c10::DeviceType::CUDA);
    } catch (const c10::Error&) {
      return static_cast<c10::Allocator*>(nullptr);
    }
  }();
  if (device.is_cuda() && cuda != nullptr)
    return at::detail::empty_strided_generic(o.sizes, o.strides, cuda, c10::DispatchKeySet(c10::DispatchKey::CUDA),
                                             o.dtype);
  return at::empty_strided(o.sizes, o.strides, at::TensorOptions().dtype(o.dtype).device(device));
}

void replay(const Plan& plan, c10::ArrayRef<c10::IValue> args, const char* op, torch::jit::Stack* stack,
            size_t n_args) {
  // The allocator and the launch work on the current device: make it the plan's.
  c10::OptionalDeviceGuard guard;
  if (plan.device.is_cuda() &&
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice() != plan.device)
    guard.reset_device(plan.device);
  c10::SmallVector<at::Tensor, 4> outputs, temps;
  for (const Output& o : plan.outputs) outputs.push_back(allocate(o, plan.device));
  for (int64_t bytes : plan.temps) temps.push_back(allocate({{bytes}, {1}, at::kByte}, plan.device));

  std::array<uint64_t, kMaxParams> slots;
  std::array<void*, kMaxParams> params;
  for (const Launch& l : plan.launches) {
    size_t n = l.params.size();
    for (size_t i = 0; i < n; ++i) {
      const Param& p = l.params[i];
      uint64_t base = 0;
      if (p.source == kInput) base = reinterpret_cast<uint64_t>(args[p.index].toTensor().data_ptr());
      if (p.source == kOutput) base = reinterpret_cast<uint64_t>(outputs[p.index].data_ptr());
      if (p.source == kTemp) base = reinterpret_cast<uint64_t>(temps[p.index].data_ptr());
      slots[i] = base + static_cast<uint64_t>(p.value);
      params[i] = &slots[i];  // little-endian: a 4-byte argument reads the low half of its slot
    }
    if (launch_hook != nullptr) {
      launch_through_hook(l, std::vector<uint64_t>(slots.begin(), slots.begin() + n));
    } else {
      launch_on_device(l, params.data(), plan.device, op);
    }
  }
  torch::jit::drop(*stack, n_args);
  for (auto& o : outputs) stack->push_back(std::move(o));
}

// ---------------------------------------------------------------------------
// Which calls may be replayed, and the key they are found by.
// ---------------------------------------------------------------------------

// Tensors the body would not see as plain dense memory, or that a trace owns.
const c10::DispatchKeySet kNotPlain({
    c10::DispatchKey::Python,
    c10::DispatchKey::PythonTLSSnapshot,
    c10::DispatchKey::Functionalize,
    c10::DispatchKey::FuncTorchBatched,
    c10::DispatchKey::FuncTorchGradWrapper,
    c10::DispatchKey::FuncTorchDynamicLayerFrontMode,
    c10::DispatchKey::FuncTorchDynamicLayerBackMode,
    c10::DispatchKey::Conjugate,
    c10::DispatchKey::Negative,
    c10::DispatchKey::ZeroTensor,
    c10::DispatchKey::Sparse,
    c10::DispatchKey::SparseCsr,
    c10::DispatchKey::NestedTensor,
});

template <class T>
void put(std::string& key, T value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof value);
}

// The key of a call, or false if the call must take the Python path.
bool make_key(c10::ArrayRef<c10::IValue> args, c10::DeviceType device_type, bool check_grad, std::string& key) {
  if (c10::impl::TorchDispatchModeTLS::stack_len() > 0) return false;
  if (c10::impl::tls_local_dispatch_key_set().included_.has_any(kNotPlain)) return false;
  bool grad = check_grad && c10::GradMode::is_enabled();
  bool any_tensor = false;
  for (const c10::IValue& a : args) {
    if (a.isTensor()) {
      const at::Tensor& t = a.toTensor();
      if (!t.defined()) {
        put(key, 'U');
        continue;
      }
      if (t.device().type() != device_type || t.layout() != at::kStrided) return false;
      if (t.key_set().has_any(kNotPlain) || (grad && t.requires_grad())) return false;
      any_tensor = true;
      put(key, 'T');
      put(key, static_cast<int8_t>(t.scalar_type()));
      put(key, static_cast<int8_t>(t.device().index()));
      put(key, static_cast<int8_t>(t.dim()));
      for (int64_t s : t.sizes()) put(key, s);
      for (int64_t s : t.strides()) put(key, s);
      // Triton specializes pointers on 16-byte alignment, and so may a body
      // (TMA needs it): key on the alignment up to 16 bytes, no further.
      uint64_t address = reinterpret_cast<uint64_t>(t.data_ptr());
      put(key, static_cast<int8_t>(address == 0 ? 5 : std::min(__builtin_ctzll(address), 4)));
    } else if (a.isNone()) {
      put(key, 'N');
    } else if (a.isBool()) {
      put(key, 'B');
      put(key, a.toBool());
    } else if (a.isInt()) {
      put(key, 'I');
      put(key, a.toInt());
    } else if (a.isDouble()) {
      put(key, 'D');
      put(key, a.toDouble());
    } else if (a.isString()) {
      const std::string& s = a.toStringRef();
      put(key, 'S');
      put(key, s.size());
      key += s;
    } else if (a.isIntList()) {
      put(key, 'L');
      auto list = a.toIntList();
      put(key, list.size());
      for (int64_t v : list) put(key, v);
    } else {
      return false;  // tensor lists, devices, ...: Python
    }
  }
  // Global state a body reads: whether float32 matmuls may use TF32.
  put(key, at::globalContext().allowTF32CuBLAS());
  return any_tensor;
}

// ---------------------------------------------------------------------------
// Plans from the Python recorder's description.
// ---------------------------------------------------------------------------

// (outputs: list of tensors, temps: list of byte counts,
//  launches: list of (function, gx, gy, gz, threads, shared, [(source, index, value), ...]))
std::shared_ptr<Plan> plan_from(py::handle description) {
  auto desc = description.cast<py::tuple>();
  auto plan = std::make_shared<Plan>();
  std::string& sig = plan->signature;
  bool have_device = false;
  for (py::handle h : desc[0].cast<py::list>()) {
    at::Tensor t = h.cast<at::Tensor>();
    plan->outputs.push_back({t.sizes().vec(), t.strides().vec(), t.scalar_type()});
    if (!have_device) plan->device = t.device();
    have_device = true;
    put(sig, static_cast<int8_t>(t.scalar_type()));
    for (int64_t s : t.sizes()) put(sig, s);
    for (int64_t s : t.strides()) put(sig, s);
    put(sig, '|');
  }
  if (!have_device) return nullptr;  // nothing to return: leave it to Python
  for (py::handle h : desc[1].cast<py::list>()) {
    plan->temps.push_back(h.cast<int64_t>());
    put(sig, plan->temps.back());
  }
  for (py::handle h : desc[2].cast<py::list>()) {
    auto item = h.cast<py::tuple>();
    Launch l;
    l.function = item[0].cast<uint64_t>();
    for (int i = 0; i < 3; ++i) l.grid[i] = item[1 + i].cast<unsigned>();
    l.threads = item[4].cast<unsigned>();
    l.shared = item[5].cast<unsigned>();
    for (py::handle ph : item[6].cast<py::list>()) {
      auto p = ph.cast<py::tuple>();
      l.params.push_back({static_cast<Source>(p[0].cast<int64_t>()), p[1].cast<int64_t>(), p[2].cast<int64_t>()});
    }
    if (l.params.size() > kMaxParams) return nullptr;
    put(sig, l.function);
    sig.append(reinterpret_cast<const char*>(l.grid), sizeof l.grid);
    put(sig, l.threads);
    put(sig, l.shared);
    for (const Param& p : l.params) {
      put(sig, p.source);
      put(sig, p.index);
      put(sig, p.value);
    }
    plan->launches.push_back(std::move(l));
  }
  return plan;
}

// ---------------------------------------------------------------------------
// The kernel registered for one op at one dispatch key.
// ---------------------------------------------------------------------------

struct Lane {
  std::string name;
  c10::DeviceType device_type;
  bool autograd;        // registered at an Autograd key: calls needing a gradient fall back
  PyObject* fallback;   // fallback(keyset, *args, **kwargs) -> outputs          (never released)
  PyObject* recorder;   // recorder(keyset, *args, **kwargs) -> (outputs, description or None)
  std::mutex mutex;
  std::unordered_map<std::string, std::shared_ptr<Plan>> plans;
  struct Attempt {
    int tries = 0;
    std::string signature;
  };
  std::unordered_map<std::string, Attempt> attempts;
  int64_t replays = 0, python_calls = 0;
};

// The Python call for the boxed arguments, as the schema names them:
// (keyset, *positional), {keyword-only arguments}.
std::pair<py::tuple, py::dict> python_arguments(const c10::FunctionSchema& schema, c10::DispatchKeySet keyset,
                                                 c10::ArrayRef<c10::IValue> args) {
  py::list positional;
  py::dict keywords;
  positional.append(py::cast(keyset));
  for (size_t i = 0; i < args.size(); ++i) {
    py::object value = torch::jit::toPyObject(args[i]);
    if (schema.arguments()[i].kwarg_only()) {
      keywords[py::str(schema.arguments()[i].name())] = value;
    } else {
      positional.append(value);
    }
  }
  return {py::tuple(positional), keywords};
}

void push_python_outputs(const c10::FunctionSchema& schema, py::handle out, torch::jit::Stack* stack) {
  const auto& returns = schema.returns();
  if (returns.size() == 1) {
    stack->push_back(torch::jit::toIValue(out, returns[0].type()));
    return;
  }
  auto items = out.cast<py::sequence>();
  for (size_t i = 0; i < returns.size(); ++i) stack->push_back(torch::jit::toIValue(items[i], returns[i].type()));
}

class LaneKernel final : public c10::OperatorKernel {
 public:
  explicit LaneKernel(std::shared_ptr<Lane> lane) : lane_(std::move(lane)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keyset, torch::jit::Stack* stack) {
    const auto& schema = op.schema();
    size_t n = schema.arguments().size();
    auto args = torch::jit::last(*stack, n);
    Lane& lane = *lane_;

    thread_local std::string key;  // reused: no allocation per call
    key.clear();
    bool replayable = enabled.load(std::memory_order_relaxed) && make_key(args, lane.device_type, lane.autograd, key);
    bool record = false;
    if (replayable) {
      std::shared_ptr<Plan> plan;
      {
        std::lock_guard<std::mutex> lock(lane.mutex);
        auto found = lane.plans.find(key);
        if (found != lane.plans.end()) {
          plan = found->second;
          ++lane.replays;
        } else {
          if (lane.attempts.size() >= kMaxPlans) lane.attempts.clear();  // keys that never settle: start over
          record = lane.attempts[key].tries < kMaxTries;
        }
      }
      if (plan) return replay(*plan, args, lane.name.c_str(), stack, n);
    }
    std::string recorded_key = record ? key : std::string();  // the Python body may call other tk ops
    call_python(schema, keyset, stack, record ? &recorded_key : nullptr);
  }

 private:
  void call_python(const c10::FunctionSchema& schema, c10::DispatchKeySet keyset, torch::jit::Stack* stack,
                   const std::string* key) {
    Lane& lane = *lane_;
    size_t n = schema.arguments().size();
    py::gil_scoped_acquire gil;
    auto [call_args, keywords] = python_arguments(schema, keyset, torch::jit::last(*stack, n));
    py::object out;
    {
      std::lock_guard<std::mutex> lock(lane.mutex);
      ++lane.python_calls;
    }
    if (key == nullptr) {
      out = py::handle(lane.fallback)(*call_args, **keywords);
    } else {
      auto result = py::handle(lane.recorder)(*call_args, **keywords).cast<py::tuple>();
      out = result[0];
      if (!result[1].is_none()) learn(*key, plan_from(result[1]));
      else forget(*key);
    }
    torch::jit::drop(*stack, n);
    push_python_outputs(schema, out, stack);
  }

  // A plan is kept once two recordings with this key agree.
  void learn(const std::string& key, std::shared_ptr<Plan> plan) {
    if (!plan) return forget(key);
    std::lock_guard<std::mutex> lock(lane_->mutex);
    auto& attempt = lane_->attempts[key];
    if (attempt.signature == plan->signature) {
      if (lane_->plans.size() >= kMaxPlans) lane_->plans.clear();
      lane_->plans[key] = std::move(plan);
      lane_->attempts.erase(key);
      return;
    }
    attempt.signature = plan->signature;
    ++attempt.tries;
  }

  void forget(const std::string& key) {
    std::lock_guard<std::mutex> lock(lane_->mutex);
    auto& attempt = lane_->attempts[key];
    attempt.signature.clear();
    ++attempt.tries;
  }

  std::shared_ptr<Lane> lane_;
};

// ---------------------------------------------------------------------------
// What Python sees.
// ---------------------------------------------------------------------------

// Never destroyed: a registration outlives the interpreter's shutdown.
auto& libraries = *new std::vector<std::unique_ptr<torch::Library>>();
auto& lanes = *new std::unordered_map<std::string, std::shared_ptr<Lane>>();  // "ns::name/Key"

void register_lane(const std::string& ns, const std::string& name, const std::string& dispatch_key,
                   const std::string& device, py::object fallback, py::object recorder) {
  c10::DispatchKey k = c10::parseDispatchKey(dispatch_key);
  auto lane = std::make_shared<Lane>();
  lane->name = name;
  lane->autograd = c10::isIncludedInAlias(k, c10::DispatchKey::Autograd);
  lane->device_type = c10::Device(device).type();
  lane->fallback = fallback.release().ptr();
  lane->recorder = recorder.release().ptr();
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, ns, k, __FILE__, __LINE__);
  lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<LaneKernel>(lane)));
  libraries.push_back(std::move(lib));
  lanes[ns + "::" + name + "/" + dispatch_key] = std::move(lane);
}

py::dict stats() {
  py::dict out;
  for (auto& [name, lane] : lanes) {
    std::lock_guard<std::mutex> lock(lane->mutex);
    out[py::str(name)] = py::dict(py::arg("plans") = lane->plans.size(), py::arg("replays") = lane->replays,
                                  py::arg("python_calls") = lane->python_calls);
  }
  return out;
}

void clear() {
  for (auto& [name, lane] : lanes) {
    std::lock_guard<std::mutex> lock(lane->mutex);
    lane->plans.clear();
    lane->attempts.clear();
    lane->replays = lane->python_calls = 0;
  }
}

void set_launch_hook(py::object hook) {
  Py_XDECREF(launch_hook);
  launch_hook = hook.is_none() ? nullptr : hook.release().ptr();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "tk's native lane: eager calls of tk ops replayed from C++";
  m.def("register_lane", &register_lane, "register the lane of ns::name at a dispatch key");
  m.def("stats", &stats, "plans kept, replays and Python calls, per registered lane");
  m.def("clear", &clear, "forget every plan and zero the counts (after changing a rule a body follows)");
  m.def("set_enabled", [](bool on) { enabled.store(on); }, "off: every call runs the op's Python kernel");
  m.def("set_launch_hook", &set_launch_hook, "tests: call hook(function, grid, threads, shared, args) instead");
}
