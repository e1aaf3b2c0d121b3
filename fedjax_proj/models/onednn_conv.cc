// NHWC / HWIO float32 2-D convolutions as XLA FFI handlers that run oneDNN's convolution
// primitives: the kernel (weight) gradient (backward-weights), and the forward convolution and the
// input gradient (forward, backward-data).
//
// Built and loaded by fedjax_proj/models/onednn.py (conv_impl="onednn_grad": the kernel gradient;
// conv_impl="onednn": all three); see docs/performance.md, "The CPU convolution kernel gradient".
//
// Operands and results carry the same leading (vmap) dims, one convolution per leading index:
//   kernel gradient: x [..., B, H, W, Ci], g [..., B, Ho, Wo, Co] -> dk [..., kh, kw, Ci, Co]
//   forward:         x [..., B, H, W, Ci], k [..., kh, kw, Ci, Co] -> y [..., B, Ho, Wo, Co]
//   input gradient:  g [..., B, Ho, Wo, Co], k [..., kh, kw, Ci, Co] -> dx [..., B, H, W, Ci]
// Attributes: strides and the (low, high) padding of each spatial dimension, already resolved by
// the caller.
//
// oneDNN picks its own layouts ("any") for the kernel, and for the activations of the kernel
// gradient (the forward and the input gradient use NHWC as given); reorders to and from the
// caller's NHWC/HWIO are built once per shape with the primitive and cached.
//
// Every primitive is built with a user-managed scratchpad (dnnl::scratchpad_mode::user), handed
// to each execution from a buffer owned by the executing thread. With oneDNN's default
// library-managed scratchpad, a primitive may only run on the thread that created it (oneDNN's
// documentation of dnnl::scratchpad_mode::library: the library scratchpad is a per-thread buffer
// shared by all primitives): the cached primitives run on whichever thread XLA calls the handler
// from, where that buffer is absent or smaller than the primitive's, and oneDNN wrote through a
// null or short scratchpad (the segmentation faults in docs/performance.md, "The CPU convolution
// kernel gradient").

#include <algorithm>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "oneapi/dnnl/dnnl.hpp"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

// Which convolution primitive a plan runs.
enum Kind : int64_t { kKernelGrad = 0, kForward = 1, kInputGrad = 2 };

// One primitive and the reorders around it: operands a and b, result out, each in the caller's
// layout (user) and the primitive's (prim).
struct Plan {
  dnnl::memory::desc a_user, b_user, out_user;
  dnnl::memory::desc a_prim, b_prim, out_prim;
  int a_arg = 0, b_arg = 0, out_arg = 0;  // the primitive's argument slots
  dnnl::primitive prim;
  std::unique_ptr<dnnl::reorder> a_reorder, b_reorder, out_reorder;  // null: layouts agree
  // Each primitive's scratchpad (user mode); size 0 where it needs none.
  dnnl::memory::desc prim_scratch, a_scratch, b_scratch, out_scratch;
  size_t scratch_bytes = 0;  // the largest of them: the executions share one buffer in turn
};

dnnl::primitive_attr UserScratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

dnnl::engine& Engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

std::unique_ptr<dnnl::reorder> ReorderOrNull(const dnnl::memory::desc& from,
                                             const dnnl::memory::desc& to,
                                             dnnl::memory::desc* scratch) {
  if (from == to) return nullptr;
  auto pd = dnnl::reorder::primitive_desc(Engine(), from, Engine(), to, UserScratchpad());
  *scratch = pd.scratchpad_desc();
  return std::make_unique<dnnl::reorder>(pd);
}

constexpr int kKeyLen = 16;

struct Key {
  int64_t v[kKeyLen];
  bool operator==(const Key& o) const {
    for (int i = 0; i < kKeyLen; ++i)
      if (v[i] != o.v[i]) return false;
    return true;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = 1469598103934665603ull;
    for (int64_t x : k.v) h = (h ^ static_cast<size_t>(x)) * 1099511628211ull;
    return h;
  }
};

// v: b, h, w, ci, ho, wo, co, kh, kw, stride_h, stride_w, pad_h_lo, pad_h_hi, pad_w_lo, pad_w_hi,
// kind.
std::unique_ptr<Plan> Build(const Key& k) {
  const int64_t b = k.v[0], h = k.v[1], w = k.v[2], ci = k.v[3], ho = k.v[4], wo = k.v[5];
  const int64_t co = k.v[6], kh = k.v[7], kw = k.v[8], sh = k.v[9], sw = k.v[10];
  // oneDNN's output size, (h - kh + lo + hi) / sh + 1 rounded down, is XLA's: the caller's pads
  // pass through unchanged.
  const int64_t ph = k.v[11], ph_hi = k.v[12], pw = k.v[13], pw_hi = k.v[14];
  const auto kind = static_cast<Kind>(k.v[15]);
  auto p = std::make_unique<Plan>();
  // oneDNN's logical order is NCHW / OIHW whatever the physical layout.
  const dnnl::memory::desc x_user({b, ci, h, w}, dt::f32, tag::nhwc);
  const dnnl::memory::desc y_user({b, co, ho, wo}, dt::f32, tag::nhwc);
  const dnnl::memory::desc k_user({co, ci, kh, kw}, dt::f32, tag::hwio);
  // The forward and the input gradient take and give the caller's NHWC activations (oneDNN's
  // brgconv / jit kernels for NHWC; no reorder of the activations): side by side on one core,
  // faster than with the layouts oneDNN picks and the reorders to them on every convolution of
  // the CNN and ResNet-8 (docs/performance.md, "oneDNN's forward and input gradient too"). The
  // kernel gradient keeps its own choice ("any"), onednn_grad's since it was measured.
  const auto act = kind == kKernelGrad ? tag::any : tag::nhwc;
  const dnnl::memory::desc x_any({b, ci, h, w}, dt::f32, act);
  const dnnl::memory::desc y_any({b, co, ho, wo}, dt::f32, act);
  const dnnl::memory::desc k_any({co, ci, kh, kw}, dt::f32, tag::any);
  const dnnl::memory::dims strides = {sh, sw}, lo = {ph, pw}, hi = {ph_hi, pw_hi};
  // The forward's descriptor is also the backward primitives' hint; its scratchpad mode matters
  // only where it runs.
  auto fwd = dnnl::convolution_forward::primitive_desc(
      Engine(), dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, x_any,
      k_any, y_any, strides, lo, hi, kind == kForward ? UserScratchpad() : dnnl::primitive_attr());
  if (kind == kKernelGrad) {
    auto bwd = dnnl::convolution_backward_weights::primitive_desc(
        Engine(), dnnl::algorithm::convolution_direct, x_any, k_any, y_any, strides, lo, hi, fwd,
        UserScratchpad());
    p->a_user = x_user, p->b_user = y_user, p->out_user = k_user;
    p->a_prim = bwd.src_desc(), p->b_prim = bwd.diff_dst_desc();
    p->out_prim = bwd.diff_weights_desc();
    p->a_arg = DNNL_ARG_SRC, p->b_arg = DNNL_ARG_DIFF_DST, p->out_arg = DNNL_ARG_DIFF_WEIGHTS;
    p->prim = dnnl::convolution_backward_weights(bwd);
    p->prim_scratch = bwd.scratchpad_desc();
  } else if (kind == kForward) {
    p->a_user = x_user, p->b_user = k_user, p->out_user = y_user;
    p->a_prim = fwd.src_desc(), p->b_prim = fwd.weights_desc(), p->out_prim = fwd.dst_desc();
    p->a_arg = DNNL_ARG_SRC, p->b_arg = DNNL_ARG_WEIGHTS, p->out_arg = DNNL_ARG_DST;
    p->prim = dnnl::convolution_forward(fwd);
    p->prim_scratch = fwd.scratchpad_desc();
  } else {
    auto bwd = dnnl::convolution_backward_data::primitive_desc(
        Engine(), dnnl::algorithm::convolution_direct, x_any, k_any, y_any, strides, lo, hi, fwd,
        UserScratchpad());
    p->a_user = y_user, p->b_user = k_user, p->out_user = x_user;
    p->a_prim = bwd.diff_dst_desc(), p->b_prim = bwd.weights_desc();
    p->out_prim = bwd.diff_src_desc();
    p->a_arg = DNNL_ARG_DIFF_DST, p->b_arg = DNNL_ARG_WEIGHTS, p->out_arg = DNNL_ARG_DIFF_SRC;
    p->prim = dnnl::convolution_backward_data(bwd);
    p->prim_scratch = bwd.scratchpad_desc();
  }
  p->a_reorder = ReorderOrNull(p->a_user, p->a_prim, &p->a_scratch);
  p->b_reorder = ReorderOrNull(p->b_user, p->b_prim, &p->b_scratch);
  p->out_reorder = ReorderOrNull(p->out_prim, p->out_user, &p->out_scratch);
  for (const auto* d : {&p->prim_scratch, &p->a_scratch, &p->b_scratch, &p->out_scratch})
    p->scratch_bytes = std::max(p->scratch_bytes, d->get_size());
  return p;
}

const Plan& GetPlan(const Key& k) {
  static std::mutex mu;
  static std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[k];
  if (!slot) slot = Build(k);
  return *slot;  // never erased, so the reference outlives the lock
}

// Per-thread buffers: the scratchpad, and the operands and result in the primitive's layout.
enum Slot { kScratch = 0, kA = 1, kB = 2, kOut = 3, kSlots = 4 };

// The calling thread's buffer `slot`, grown to at least `bytes` and kept: one call at a time uses
// it (a thread runs one handler call at a time, and a call runs its primitives in turn), so
// concurrent calls on other threads never share it. Kept rather than allocated per call: a
// reordered activation of tens of MB, freshly allocated, is fresh pages each call, and faulting
// them in cost more than the convolution (conv_impl="onednn"'s forward at batch 256).
void* ThreadBuffer(Slot slot, size_t bytes) {
  thread_local dnnl::memory buffers[kSlots];
  dnnl::memory& buffer = buffers[slot];
  if (bytes == 0) return nullptr;
  if (!buffer || buffer.get_desc().get_size() < bytes) {
    const auto n = static_cast<dnnl::memory::dim>(bytes);
    buffer = dnnl::memory(dnnl::memory::desc({n}, dt::u8, tag::a), Engine());  // 64-byte aligned
  }
  return buffer.get_data_handle();
}

// A primitive's arguments plus its scratchpad (at `scratch`, when its descriptor needs one).
void Execute(const dnnl::primitive& prim, dnnl::stream& stream,
             std::unordered_map<int, dnnl::memory> args, const dnnl::memory::desc& desc,
             void* scratch) {
  if (desc.get_size() > 0) args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(desc, Engine(), scratch));
  prim.execute(stream, args);
}

using Dims = ffi::Span<const int64_t>;

// One call of any kind: x, g and k are the convolution's input, output (or its gradient) and
// kernel dims, of which the call's operands and result are three.
ffi::Error Run(Kind kind, const char* what, const float* a, const float* b, float* out, Dims xd,
               Dims gd, Dims kd, int64_t stride_h, int64_t stride_w, int64_t pad_h_lo,
               int64_t pad_h_hi, int64_t pad_w_lo, int64_t pad_w_hi) {
  if (xd.size() < 4 || gd.size() != xd.size() || kd.size() != xd.size())
    return ffi::Error::InvalidArgument(std::string(what) + ": operands need equal rank >= 4");
  const size_t lead = xd.size() - 4;
  int64_t n = 1;
  for (size_t i = 0; i < lead; ++i) {
    if (xd[i] != gd[i] || xd[i] != kd[i])
      return ffi::Error::InvalidArgument(std::string(what) + ": leading (vmap) dims differ");
    n *= xd[i];
  }
  const Key key{{xd[lead], xd[lead + 1], xd[lead + 2], xd[lead + 3], gd[lead + 1], gd[lead + 2],
                 gd[lead + 3], kd[lead], kd[lead + 1], stride_h, stride_w, pad_h_lo, pad_h_hi,
                 pad_w_lo, pad_w_hi, kind}};
  if (gd[lead] != xd[lead] || kd[lead + 2] != xd[lead + 3] || kd[lead + 3] != gd[lead + 3])
    return ffi::Error::InvalidArgument(std::string(what) + ": x, g and kernel shapes disagree");
  try {
    const Plan& p = GetPlan(key);
    // No lock: with user-managed scratchpads a cached primitive may run on several threads at
    // once (oneDNN's dnnl::scratchpad_mode::user), each with its own thread's buffer.
    void* scratch = ThreadBuffer(kScratch, p.scratch_bytes);
    dnnl::stream stream(Engine());
    const size_t a_size = p.a_user.get_size() / sizeof(float);
    const size_t b_size = p.b_user.get_size() / sizeof(float);
    const size_t out_size = p.out_user.get_size() / sizeof(float);
    dnnl::memory a_tmp, b_tmp, out_tmp;
    if (p.a_reorder) a_tmp = dnnl::memory(p.a_prim, Engine(), ThreadBuffer(kA, p.a_prim.get_size()));
    if (p.b_reorder) b_tmp = dnnl::memory(p.b_prim, Engine(), ThreadBuffer(kB, p.b_prim.get_size()));
    if (p.out_reorder)
      out_tmp = dnnl::memory(p.out_prim, Engine(), ThreadBuffer(kOut, p.out_prim.get_size()));
    for (int64_t i = 0; i < n; ++i) {
      // oneDNN's memory takes a non-const handle; it only reads the operands.
      dnnl::memory a_mem(p.a_user, Engine(), const_cast<float*>(a) + i * a_size);
      dnnl::memory b_mem(p.b_user, Engine(), const_cast<float*>(b) + i * b_size);
      dnnl::memory out_mem(p.out_user, Engine(), out + i * out_size);
      if (p.a_reorder)
        Execute(*p.a_reorder, stream, {{DNNL_ARG_FROM, a_mem}, {DNNL_ARG_TO, a_tmp}},
                p.a_scratch, scratch);
      if (p.b_reorder)
        Execute(*p.b_reorder, stream, {{DNNL_ARG_FROM, b_mem}, {DNNL_ARG_TO, b_tmp}},
                p.b_scratch, scratch);
      Execute(p.prim, stream,
              {{p.a_arg, p.a_reorder ? a_tmp : a_mem},
               {p.b_arg, p.b_reorder ? b_tmp : b_mem},
               {p.out_arg, p.out_reorder ? out_tmp : out_mem}},
              p.prim_scratch, scratch);
      if (p.out_reorder)
        Execute(*p.out_reorder, stream, {{DNNL_ARG_FROM, out_tmp}, {DNNL_ARG_TO, out_mem}},
                p.out_scratch, scratch);
    }
    stream.wait();
  } catch (const dnnl::error& e) {
    return ffi::Error::Internal(std::string(what) + ": oneDNN: " + e.what());
  } catch (const std::exception& e) {  // e.g. bad_alloc: an error for XLA, never an abort
    return ffi::Error::Internal(std::string(what) + ": " + e.what());
  }
  return ffi::Error::Success();
}

ffi::Error KernelGrad(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> g,
                      ffi::ResultBuffer<ffi::F32> dk, int64_t stride_h, int64_t stride_w,
                      int64_t pad_h_lo, int64_t pad_h_hi, int64_t pad_w_lo, int64_t pad_w_hi) {
  return Run(kKernelGrad, "onednn kernel grad", x.typed_data(), g.typed_data(), dk->typed_data(),
             x.dimensions(), g.dimensions(), dk->dimensions(), stride_h, stride_w, pad_h_lo,
             pad_h_hi, pad_w_lo, pad_w_hi);
}

ffi::Error Forward(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> k,
                   ffi::ResultBuffer<ffi::F32> y, int64_t stride_h, int64_t stride_w,
                   int64_t pad_h_lo, int64_t pad_h_hi, int64_t pad_w_lo, int64_t pad_w_hi) {
  return Run(kForward, "onednn forward", x.typed_data(), k.typed_data(), y->typed_data(),
             x.dimensions(), y->dimensions(), k.dimensions(), stride_h, stride_w, pad_h_lo,
             pad_h_hi, pad_w_lo, pad_w_hi);
}

ffi::Error InputGrad(ffi::Buffer<ffi::F32> g, ffi::Buffer<ffi::F32> k,
                     ffi::ResultBuffer<ffi::F32> dx, int64_t stride_h, int64_t stride_w,
                     int64_t pad_h_lo, int64_t pad_h_hi, int64_t pad_w_lo, int64_t pad_w_hi) {
  return Run(kInputGrad, "onednn input grad", g.typed_data(), k.typed_data(), dx->typed_data(),
             dx->dimensions(), g.dimensions(), k.dimensions(), stride_h, stride_w, pad_h_lo,
             pad_h_hi, pad_w_lo, pad_w_hi);
}

// The three handlers' shared signature: two float32 operands, one result, the six attributes.
auto Binding() {
  return ffi::Ffi::Bind()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Ret<ffi::Buffer<ffi::F32>>()
      .Attr<int64_t>("stride_h")
      .Attr<int64_t>("stride_w")
      .Attr<int64_t>("pad_h_lo")
      .Attr<int64_t>("pad_h_hi")
      .Attr<int64_t>("pad_w_lo")
      .Attr<int64_t>("pad_w_hi");
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(FedjaxOnednnConvKernelGrad, KernelGrad, Binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(FedjaxOnednnConvForward, Forward, Binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(FedjaxOnednnConvInputGrad, InputGrad, Binding());

// The oneDNN version the library was built against, read by the loader for its one-line report.
extern "C" const char* FedjaxOnednnVersion() {
  static std::string v = [] {
    const dnnl_version_t* ver = dnnl_version();
    return std::to_string(ver->major) + "." + std::to_string(ver->minor) + "." +
           std::to_string(ver->patch);
  }();
  return v.c_str();
}
