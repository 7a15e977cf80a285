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
// A call that needs a gradient, for an op whose backward is declared as one
// call of another op (ops/_registry.py, ``register_formula``), gets its
// autograd node here too (``TkBackward``): the forward goes below autograd
// (and is replayed as above), the backward calls the declared op through the
// dispatcher.  No Python runs on either side.
//
// Anything it does not recognise goes to the Python kernel it replaced
// (the fallback): another call that needs a gradient, a traced call (fake or
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
#include <ATen/autocast_mode.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <dlfcn.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
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
  bool overlapped;  // a programmatic dependent of the launch before it (the binary waits where it must)
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
// cuLaunchKernelEx's configuration, as cuda.h (CUDA 12) lays it out: a launch
// attribute is an id, padding to 8 bytes and a 64-byte value.
struct LaunchAttribute {
  int id;
  char pad[4];
  union {
    char bytes[64];
    int programmatic_stream_serialization_allowed;
  } value;
};
struct LaunchConfig {
  unsigned grid[3];
  unsigned block[3];
  unsigned shared;
  void* stream;
  LaunchAttribute* attrs;
  unsigned n_attrs;
};
constexpr int kProgrammaticStreamSerialization = 6;  // CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
using LaunchExFn = int (*)(const LaunchConfig*, void*, void**, void**);
using IsCapturingFn = int (*)(void*, int*);
using CtxGetFn = int (*)(void**);
using CtxSetFn = int (*)(void*);
using RetainFn = int (*)(void**, int);

struct Driver {
  LaunchFn launch = nullptr;
  LaunchExFn launch_ex = nullptr;  // a driver before CUDA 12 has none: overlapped launches are then plain
  IsCapturingFn is_capturing = nullptr;
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
    found.launch_ex = reinterpret_cast<LaunchExFn>(dlsym(lib, "cuLaunchKernelEx"));
    found.is_capturing = reinterpret_cast<IsCapturingFn>(dlsym(lib, "cuStreamIsCapturing"));
    found.ctx_get = reinterpret_cast<CtxGetFn>(dlsym(lib, "cuCtxGetCurrent"));
    found.ctx_set = reinterpret_cast<CtxSetFn>(dlsym(lib, "cuCtxSetCurrent"));
    found.retain = reinterpret_cast<RetainFn>(dlsym(lib, "cuDevicePrimaryCtxRetain"));
    return found;
  }();
  return d;
}

PyObject* launch_hook = nullptr;  // tests: called instead of the driver (owned reference)
std::atomic<bool> enabled{true};   // off: every call goes to the Python kernel, unrecorded

// Whether work on `stream` is being captured into a CUDA graph.  A graph's kernels
// follow each other closely already: there an overlapped launch saved nothing and
// its edge cost 0.2-0.3 µs on an H100 (docs/perf-notes.md, version 37), so it is
// captured as a plain launch.
bool capturing(const Driver& d, void* stream) {
  int status = 0;  // CU_STREAM_CAPTURE_STATUS_NONE
  return d.is_capturing != nullptr && d.is_capturing(stream, &status) == 0 && status != 0;
}

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
  void* function = reinterpret_cast<void*>(l.function);
  if (l.overlapped && d.launch_ex != nullptr && !capturing(d, stream)) {
    // May start before the kernel ahead of it in the stream ends, as Triton's launcher starts it.
    LaunchAttribute overlap{};
    overlap.id = kProgrammaticStreamSerialization;
    overlap.value.programmatic_stream_serialization_allowed = 1;
    LaunchConfig config{{l.grid[0], l.grid[1], l.grid[2]}, {l.threads, 1, 1}, l.shared, stream, &overlap, 1};
    int error = d.launch_ex(&config, function, params, nullptr);
    TORCH_CHECK(error == 0, "tk.", op, ": cuLaunchKernelEx failed with CUDA error ", error);
    return;
  }
  int error = d.launch(function, l.grid[0], l.grid[1], l.grid[2], l.threads, 1, 1, l.shared, stream, params, nullptr);
  TORCH_CHECK(error == 0, "tk.", op, ": cuLaunchKernel failed with CUDA error ", error);
}

void launch_through_hook(const Launch& l, const std::vector<uint64_t>& slots) {
  py::gil_scoped_acquire gil;
  py::list values;
  for (uint64_t v : slots) values.append(py::int_(v));
  py::handle hook(launch_hook);
  hook(l.function, py::make_tuple(l.grid[0], l.grid[1], l.grid[2]), l.threads, l.shared, values, l.overlapped);
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

// No dispatch mode and no functorch or functionalization layer is active.
bool untraced() {
  return c10::impl::TorchDispatchModeTLS::stack_len() == 0 &&
         !c10::impl::tls_local_dispatch_key_set().included_.has_any(kNotPlain);
}

// A defined tensor the body sees as plain dense memory on the lane's device.
bool plain(const at::Tensor& t, c10::DeviceType device_type) {
  return t.device().type() == device_type && t.layout() == at::kStrided && !t.key_set().has_any(kNotPlain);
}

template <class T>
void put(std::string& key, T value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof value);
}

// The key of a call, or false if the call must take the Python path.
bool make_key(c10::ArrayRef<c10::IValue> args, c10::DeviceType device_type, bool check_grad, std::string& key) {
  if (!untraced()) return false;
  bool grad = check_grad && c10::GradMode::is_enabled();
  bool any_tensor = false;
  for (const c10::IValue& a : args) {
    if (a.isTensor()) {
      const at::Tensor& t = a.toTensor();
      if (!t.defined()) {
        put(key, 'U');
        continue;
      }
      if (!plain(t, device_type) || (grad && t.requires_grad())) return false;
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
//  launches: list of (function, gx, gy, gz, threads, shared, overlapped, [(source, index, value), ...]))
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
    l.overlapped = item[6].cast<bool>();
    for (py::handle ph : item[7].cast<py::list>()) {
      auto p = ph.cast<py::tuple>();
      l.params.push_back({static_cast<Source>(p[0].cast<int64_t>()), p[1].cast<int64_t>(), p[2].cast<int64_t>()});
    }
    if (l.params.size() > kMaxParams) return nullptr;
    put(sig, l.function);
    sig.append(reinterpret_cast<const char*>(l.grid), sizeof l.grid);
    put(sig, l.threads);
    put(sig, l.shared);
    put(sig, l.overlapped);
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
// Gradients without Python: an op whose backward is one call of another op.
// ---------------------------------------------------------------------------

namespace ag = torch::autograd;

// What the backward op is called with, in order (Formula::arguments).
enum Token : int64_t {
  kIncomingGradient = 0,  // the gradient of the op's result
  kArgument = 1,          // forward argument `index`, saved from the forward
  kResult = 2,            // the op's result
  kNeedsGradient = 3,     // whether forward argument `index` needs a gradient (a bool)
  kDtypeOf = 4,           // the dtype of forward tensor argument `index` (saved; not the tensor)
};
// What a forward argument's gradient is (Formula::gradients).
constexpr int64_t kNoGradient = -2, kIsIncomingGradient = -1;  // else: the backward op's result `index`

struct Formula {
  std::string node_name;
  std::optional<c10::OperatorHandle> backward;  // none: every gradient is the incoming one or none
  std::vector<std::pair<Token, int64_t>> arguments;
  std::vector<int64_t> gradients;  // one per forward argument
  std::vector<char> read;          // per forward argument: the backward reads it
  std::vector<char> reads_dtype;   // per forward argument: the backward reads its dtype
  bool reads_result = false;
};

// torch 2.13 holds autograd nodes in intrusive_ptrs, earlier versions in
// shared_ptrs; both branches are templates so only the one that applies is compiled.
using NodePtr = decltype(ag::Edge::function);
constexpr bool kSharedNodes = std::is_same_v<NodePtr, std::shared_ptr<ag::Node>>;

template <class T, class... Args>
NodePtr make_node(Args&&... args) {
  if constexpr (kSharedNodes) {
    // deleteNode frees a long chain of nodes without deep recursion.
    return std::shared_ptr<T>(new T(std::forward<Args>(args)...), [](auto* node) { deleteNode(node); });
  } else {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  }
}

template <class T>
NodePtr pointer_to(T* node) {
  if constexpr (kSharedNodes) {
    return node->shared_from_this();
  } else {
    return c10::intrusive_ptr<T>::reclaim_copy(node);
  }
}

// The node of one call: what the backward reads, and the formula to run it.
class TkBackward final : public ag::Node {
 public:
  TkBackward(std::shared_ptr<const Formula> formula, ag::edge_list&& edges)
      : ag::Node(std::move(edges)), formula_(std::move(formula)) {}

  std::string name() const override { return formula_->node_name; }

  // Before the result's history is set: inputs are saved as inputs.
  void save_arguments(const std::vector<c10::IValue>& args) {
    saved_.resize(args.size());
    values_.resize(args.size());
    dtypes_.resize(args.size());
    is_tensor_.assign(args.size(), 0);
    for (size_t i = 0; i < args.size(); ++i) {
      if (formula_->reads_dtype[i] && args[i].isTensor()) dtypes_[i] = args[i].toTensor().scalar_type();
      if (!formula_->read[i]) continue;
      if (args[i].isTensor() && args[i].toTensor().defined()) {
        saved_[i] = ag::SavedVariable(args[i].toTensor(), /*is_output=*/false);
        is_tensor_[i] = 1;
      } else {
        values_[i] = args[i];
      }
    }
  }

  // After: the result is saved as an output (no reference cycle through its grad_fn).
  void save_result(const at::Tensor& result) {
    if (formula_->reads_result) result_ = ag::SavedVariable(result, /*is_output=*/true);
  }

  ag::variable_list apply(ag::variable_list&& grads) override {
    const Formula& f = *formula_;
    // As a Python Function does: a result nobody used gets a zero gradient.
    at::Tensor grad = grads[0].defined() ? grads[0] : input_metadata(0).zeros_like();
    torch::jit::Stack stack;
    if (f.backward) {
      for (const auto& [kind, index] : f.arguments) {
        if (kind == kIncomingGradient) stack.emplace_back(grad);
        if (kind == kResult) stack.emplace_back(result_.unpack(pointer_to(this)));
        if (kind == kNeedsGradient) stack.emplace_back(task_should_compute_output(index));
        if (kind == kDtypeOf) stack.emplace_back(dtypes_[index]);
        if (kind == kArgument) stack.emplace_back(is_tensor_[index] ? c10::IValue(saved_[index].unpack()) : values_[index]);
      }
      f.backward->callBoxed(stack);
    }
    ag::variable_list out(num_outputs());
    for (size_t i = 0; i < out.size(); ++i) {
      int64_t g = f.gradients[i];
      if (g == kNoGradient || !task_should_compute_output(i)) continue;
      out[i] = g == kIsIncomingGradient ? grad : stack[g].toTensor();
    }
    return out;
  }

  void release_variables() override {
    for (auto& s : saved_) s.reset_data();
    result_.reset_data();
  }

 private:
  std::shared_ptr<const Formula> formula_;
  std::vector<ag::SavedVariable> saved_;  // per forward argument: the tensors the backward reads
  std::vector<c10::IValue> values_;       // per forward argument: the other values it reads
  std::vector<c10::IValue> dtypes_;       // per forward argument: its dtype, where the backward reads that
  std::vector<char> is_tensor_;           // per forward argument: saved_ holds it
  ag::SavedVariable result_;
};

// Whether a call needs a gradient that a TkBackward node can give: plain
// dense tensors on the lane's device, nothing tracing, no forward-mode
// gradient, and argument types the node knows.
bool wants_node(c10::ArrayRef<c10::IValue> args, c10::DeviceType device_type) {
  // Most calls need no gradient: this first pass is all they pay.
  if (!c10::GradMode::is_enabled()) return false;
  bool needs = false;
  for (const c10::IValue& a : args) needs = needs || (a.isTensor() && a.toTensor().requires_grad());
  if (!needs || !untraced()) return false;
  for (const c10::IValue& a : args) {
    if (a.isTensor()) {
      const at::Tensor& t = a.toTensor();
      if (t.defined() && (!plain(t, device_type) || t._fw_grad(/*level=*/0).defined())) return false;
    } else if (!(a.isNone() || a.isBool() || a.isInt() || a.isDouble() || a.isString() || a.isIntList())) {
      return false;
    }
  }
  return true;
}

// The call below autograd (replayed where it can be), then its node.
void call_with_node(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t n_args,
                    std::shared_ptr<const Formula> formula) {
  std::vector<c10::IValue> args(stack->end() - n_args, stack->end());
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.callBoxed(stack);
  }
  const at::Tensor& result = stack->back().toTensor();
  if (!result.defined() || !(at::isFloatingType(result.scalar_type()) || at::isComplexType(result.scalar_type())))
    return;
  ag::edge_list edges;
  edges.reserve(n_args);
  for (const c10::IValue& a : args)
    edges.push_back(a.isTensor() && a.toTensor().defined() ? ag::impl::gradient_edge(a.toTensor()) : ag::Edge());
  NodePtr node = make_node<TkBackward>(std::move(formula), std::move(edges));
  auto* tk_node = static_cast<TkBackward*>(node.get());
  tk_node->save_arguments(args);
  ag::set_history(result, node);
  tk_node->save_result(result);
}

// (node name, "ns::backward_op" or "", [(token, index)], [gradient per forward argument]).
// A description it cannot use gives no formula and says why in `error` (no C++
// exception crosses into Python from here).
std::shared_ptr<const Formula> formula_from(py::handle description, size_t n_args, std::string& error) {
  auto desc = description.cast<py::tuple>();
  auto f = std::make_shared<Formula>();
  f->node_name = desc[0].cast<std::string>();
  auto backward = desc[1].cast<std::string>();
  size_t n_results = 0;
  if (!backward.empty()) {
    f->backward = c10::Dispatcher::singleton().findSchema({backward, ""});
    if (!f->backward) {
      error = "formula: no op named " + backward;
      return nullptr;
    }
    n_results = f->backward->schema().returns().size();
  }
  f->read.assign(n_args, 0);
  f->reads_dtype.assign(n_args, 0);
  for (py::handle h : desc[2].cast<py::list>()) {
    auto item = h.cast<py::tuple>();
    auto kind = static_cast<Token>(item[0].cast<int64_t>());
    int64_t index = item[1].cast<int64_t>();
    if (kind < kIncomingGradient || kind > kDtypeOf) {
      error = "formula: unknown token " + std::to_string(kind);
      return nullptr;
    }
    if (kind != kIncomingGradient && kind != kResult && (index < 0 || static_cast<size_t>(index) >= n_args)) {
      error = "formula: argument " + std::to_string(index) + " out of range";
      return nullptr;
    }
    if (kind == kArgument) f->read[index] = 1;
    if (kind == kDtypeOf) f->reads_dtype[index] = 1;
    if (kind == kResult) f->reads_result = true;
    f->arguments.emplace_back(kind, index);
  }
  for (py::handle h : desc[3].cast<py::list>()) {
    int64_t g = h.cast<int64_t>();
    if (g < kNoGradient || g >= static_cast<int64_t>(n_results)) {
      error = "formula: gradient " + std::to_string(g) + " is not one of the " + std::to_string(n_results) +
              " results of the backward op";
      return nullptr;
    }
    f->gradients.push_back(g);
  }
  if (f->gradients.size() != n_args) {
    error = "formula: " + std::to_string(f->gradients.size()) + " gradients for " + std::to_string(n_args) + " arguments";
    return nullptr;
  }
  return f;
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
  std::shared_ptr<const Formula> formula;  // at an Autograd key: calls needing a gradient get a TkBackward
  int64_t replays = 0, python_calls = 0, nodes = 0;
};

// A boxed argument as Python sees it.  A dtype travels boxed as an int, so an
// argument the schema types ScalarType (or ScalarType?) becomes a torch.dtype.
py::object to_python(const c10::Argument& argument, const c10::IValue& value) {
  if (value.isInt()) {
    c10::TypePtr type = argument.real_type();
    if (auto optional = type->cast<c10::OptionalType>()) type = optional->getElementType();
    if (type->kind() == c10::TypeKind::ScalarTypeType) {
      return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(value.toScalarType())));
    }
  }
  return torch::jit::toPyObject(value);
}

// The Python call for the boxed arguments, as the schema names them:
// (keyset, *positional), {keyword-only arguments}.
std::pair<py::tuple, py::dict> python_arguments(const c10::FunctionSchema& schema, c10::DispatchKeySet keyset,
                                                 c10::ArrayRef<c10::IValue> args) {
  py::list positional;
  py::dict keywords;
  positional.append(py::cast(keyset));
  for (size_t i = 0; i < args.size(); ++i) {
    py::object value = to_python(schema.arguments()[i], args[i]);
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
    bool on = enabled.load(std::memory_order_relaxed);

    if (on && lane.autograd && wants_node(args, lane.device_type)) {
      std::shared_ptr<const Formula> formula;
      {
        std::lock_guard<std::mutex> lock(lane.mutex);
        formula = lane.formula;
        if (formula) ++lane.nodes;
      }
      if (formula) return call_with_node(op, stack, n, std::move(formula));
    }

    thread_local std::string key;  // reused: no allocation per call
    key.clear();
    bool replayable = on && make_key(args, lane.device_type, lane.autograd, key);
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

// ---------------------------------------------------------------------------
// Autocast: the casts of follow_autocast (ops/_registry.py), made as PyTorch
// makes its own ops' (at::autocast::cached_cast, with its cache of casts of
// float32 leaves), for about what PyTorch's cost.  H100 host, a 64x64
// bfloat16 tk.matmul: 6.7 us a call, 6.9 under autocast (30 with the Python
// kernel; torch.matmul 12.8), 15.8 when the cast is real (torch.matmul 21.4).
// ---------------------------------------------------------------------------

// The policies, as ops/_registry.py names them.
enum class CastPolicy { kLowerPrecision, kFloat32, kFloat32Result };

struct AutocastKernel final : c10::OperatorKernel {
  AutocastKernel(c10::DeviceType device, CastPolicy policy, size_t dtype_at)
      : device_(device), policy_(policy), dtype_at_(dtype_at) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size();
    auto first = stack->end() - n;
    if (policy_ == CastPolicy::kFloat32Result) {
      set_float32_dtype(first);
      ++first;  // read as it is by the kernels, which widen it themselves
    }
    const at::ScalarType dtype =
        policy_ == CastPolicy::kLowerPrecision ? at::autocast::get_autocast_dtype(device_) : at::kFloat;
    for (auto it = first; it != stack->end(); ++it) {
      if (it->isTensor()) *it = at::autocast::cached_cast(dtype, it->toTensor(), device_);  // float64 stays
    }
    c10::impl::ExcludeDispatchKeyGuard no_autocast(at::autocast::get_autocast_dispatch_key_from_device_type(device_));
    op.callBoxed(stack);
  }

  // As PyTorch's fp32_set_opt_dtype: when the first argument is a tensor autocast
  // would cast, an unset `dtype` becomes float32 and that argument stays as it is
  // (the other tensors are cast to float32, as kFloat32 casts them).
  void set_float32_dtype(torch::jit::Stack::iterator args) const {
    if (!args[0].isTensor()) return;
    const at::Tensor& first = args[0].toTensor();
    if (!first.defined() || !first.is_floating_point() || first.scalar_type() == at::kDouble ||
        first.device().type() != device_)
      return;
    if (args[dtype_at_].isNone()) args[dtype_at_] = c10::IValue(at::kFloat);
  }

  c10::DeviceType device_;
  CastPolicy policy_;
  size_t dtype_at_;  // kFloat32Result: where the op's `dtype` argument is
};

void register_autocast(const std::string& ns, const std::string& name, const std::string& device,
                       const std::string& policy_name) {
  const c10::DeviceType type = c10::Device(device).type();
  CastPolicy policy;
  if (policy_name == "lower_precision") {
    policy = CastPolicy::kLowerPrecision;
  } else if (policy_name == "float32") {
    policy = CastPolicy::kFloat32;
  } else if (policy_name == "float32_result") {
    policy = CastPolicy::kFloat32Result;
  } else {
    throw std::invalid_argument(ns + "::" + name + ": unknown autocast policy " + policy_name);  // a ValueError
  }
  size_t dtype_at = 0;
  if (policy == CastPolicy::kFloat32Result) {
    auto op = c10::Dispatcher::singleton().findSchema({ns + "::" + name, ""});
    auto found = op ? op->schema().argumentIndexWithName("dtype") : std::nullopt;
    if (!found) throw std::invalid_argument(ns + "::" + name + ": autocast policy float32_result needs a `dtype` argument");
    dtype_at = *found;
  }
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, ns,
                                              at::autocast::get_autocast_dispatch_key_from_device_type(type),
                                              __FILE__, __LINE__);
  lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<AutocastKernel>(type, policy, dtype_at)));
  libraries.push_back(std::move(lib));
}

// The formula of ns::name's autograd lanes (None: calls needing a gradient go to
// Python).  Returns why a description was refused, or "" (the lanes keep theirs then).
std::string set_formula(const std::string& ns, const std::string& name, py::object description) {
  auto op = c10::Dispatcher::singleton().findSchema({ns + "::" + name, ""});
  if (!op) return "no op named " + ns + "::" + name;
  const c10::FunctionSchema& schema = op->schema();
  std::shared_ptr<const Formula> formula;
  if (!description.is_none()) {
    if (schema.returns().size() != 1) return ns + "::" + name + ": a formula is for an op with one result";
    std::string error;
    formula = formula_from(description, schema.arguments().size(), error);
    if (!formula) return ns + "::" + name + ": " + error;
  }
  const std::string prefix = ns + "::" + name + "/";
  for (auto& [key, lane] : lanes) {
    if (key.rfind(prefix, 0) != 0 || !lane->autograd) continue;
    std::lock_guard<std::mutex> lock(lane->mutex);
    lane->formula = formula;
  }
  return "";
}

py::dict stats() {
  py::dict out;
  for (auto& [name, lane] : lanes) {
    std::lock_guard<std::mutex> lock(lane->mutex);
    out[py::str(name)] = py::dict(py::arg("plans") = lane->plans.size(), py::arg("replays") = lane->replays,
                                  py::arg("python_calls") = lane->python_calls, py::arg("nodes") = lane->nodes);
  }
  return out;
}

void clear() {
  for (auto& [name, lane] : lanes) {
    std::lock_guard<std::mutex> lock(lane->mutex);
    lane->plans.clear();
    lane->attempts.clear();
    lane->replays = lane->python_calls = lane->nodes = 0;
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
  m.def("register_autocast", &register_autocast, "under autocast, cast ns::name's floating inputs (to float32 or the autocast dtype) or set its dtype");
  m.def("set_formula", &set_formula, "the backward of ns::name as one call of another op, or None");
  m.def("stats", &stats, "plans kept, replays, Python calls and autograd nodes made, per registered lane");
  m.def("clear", &clear, "forget every plan and zero the counts (after changing a rule a body follows)");
  m.def("set_enabled", [](bool on) { enabled.store(on); }, "off: every call runs the op's Python kernel");
  m.def("set_launch_hook", &set_launch_hook, "tests: call hook(function, grid, threads, shared, args, overlapped) instead");
}
