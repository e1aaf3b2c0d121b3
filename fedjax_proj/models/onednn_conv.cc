// The kernel (weight) gradient of an NHWC / HWIO float32 2-D convolution, as an XLA FFI handler
// that runs oneDNN's convolution backward-weights primitive.
//
// Built and loaded by fedjax_proj/models/onednn.py (conv_impl="onednn_grad"); see
// docs/performance.md, "The CPU convolution kernel gradient".
//
// Operands: x [..., B, H, W, Ci] and g [..., B, Ho, Wo, Co] with the same leading (vmap) dims;
// result dk [..., kh, kw, Ci, Co], one kernel gradient per leading index. Attributes: strides
// and the (low, high) padding of each spatial dimension, already resolved by the caller.
//
// oneDNN picks its own layouts ("any") for the operands and the gradient; reorders to and from
// the caller's NHWC/HWIO are built once per shape with the primitive and cached.
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

struct Plan {
  dnnl::memory::desc x_user, g_user, dk_user;  // the caller's NHWC / NHWC / HWIO
  dnnl::memory::desc x_prim, g_prim, dk_prim;  // the primitive's choice
  dnnl::convolution_backward_weights conv;
  std::unique_ptr<dnnl::reorder> x_reorder, g_reorder, dk_reorder;  // null: layouts agree
  // Each primitive's scratchpad (user mode); size 0 where it needs none.
  dnnl::memory::desc conv_scratch, x_scratch, g_scratch, dk_scratch;
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

struct Key {
  int64_t v[15];
  bool operator==(const Key& o) const {
    for (int i = 0; i < 15; ++i)
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

// v: b, h, w, ci, ho, wo, co, kh, kw, stride_h, stride_w, pad_h_lo, pad_h_hi, pad_w_lo, pad_w_hi.
std::unique_ptr<Plan> Build(const Key& k) {
  const int64_t b = k.v[0], h = k.v[1], w = k.v[2], ci = k.v[3], ho = k.v[4], wo = k.v[5];
  const int64_t co = k.v[6], kh = k.v[7], kw = k.v[8], sh = k.v[9], sw = k.v[10];
  // oneDNN's output size, (h - kh + lo + hi) / sh + 1 rounded down, is XLA's: the caller's pads
  // pass through unchanged.
  const int64_t ph = k.v[11], ph_hi = k.v[12], pw = k.v[13], pw_hi = k.v[14];
  auto p = std::make_unique<Plan>();
  // oneDNN's logical order is NCHW / OIHW whatever the physical layout.
  p->x_user = dnnl::memory::desc({b, ci, h, w}, dt::f32, tag::nhwc);
  p->g_user = dnnl::memory::desc({b, co, ho, wo}, dt::f32, tag::nhwc);
  p->dk_user = dnnl::memory::desc({co, ci, kh, kw}, dt::f32, tag::hwio);
  dnnl::memory::desc x_any({b, ci, h, w}, dt::f32, tag::any);
  dnnl::memory::desc g_any({b, co, ho, wo}, dt::f32, tag::any);
  dnnl::memory::desc dk_any({co, ci, kh, kw}, dt::f32, tag::any);
  const dnnl::memory::dims strides = {sh, sw}, lo = {ph, pw}, hi = {ph_hi, pw_hi};
  auto fwd = dnnl::convolution_forward::primitive_desc(
      Engine(), dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, x_any,
      dk_any, g_any, strides, lo, hi);
  auto bwd = dnnl::convolution_backward_weights::primitive_desc(
      Engine(), dnnl::algorithm::convolution_direct, x_any, dk_any, g_any, strides, lo, hi, fwd,
      UserScratchpad());
  p->x_prim = bwd.src_desc();
  p->g_prim = bwd.diff_dst_desc();
  p->dk_prim = bwd.diff_weights_desc();
  p->conv = dnnl::convolution_backward_weights(bwd);
  p->conv_scratch = bwd.scratchpad_desc();
  p->x_reorder = ReorderOrNull(p->x_user, p->x_prim, &p->x_scratch);
  p->g_reorder = ReorderOrNull(p->g_user, p->g_prim, &p->g_scratch);
  p->dk_reorder = ReorderOrNull(p->dk_prim, p->dk_user, &p->dk_scratch);
  for (const auto* d : {&p->conv_scratch, &p->x_scratch, &p->g_scratch, &p->dk_scratch})
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

// The calling thread's scratchpad buffer, grown to at least `bytes`: one execution at a time uses
// it (a thread runs one handler call at a time, and a call runs its primitives in turn), so
// concurrent calls on other threads never share it.
void* ThreadScratch(size_t bytes) {
  thread_local dnnl::memory buffer;
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

ffi::Error KernelGrad(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> g,
                      ffi::ResultBuffer<ffi::F32> dk, int64_t stride_h, int64_t stride_w,
                      int64_t pad_h_lo, int64_t pad_h_hi, int64_t pad_w_lo, int64_t pad_w_hi) {
  auto xd = x.dimensions(), gd = g.dimensions(), kd = dk->dimensions();
  if (xd.size() < 4 || gd.size() != xd.size() || kd.size() != xd.size())
    return ffi::Error::InvalidArgument("onednn kernel grad: x, g and dk need equal rank >= 4");
  const size_t lead = xd.size() - 4;
  int64_t n = 1;
  for (size_t i = 0; i < lead; ++i) {
    if (xd[i] != gd[i] || xd[i] != kd[i])
      return ffi::Error::InvalidArgument("onednn kernel grad: leading (vmap) dims differ");
    n *= xd[i];
  }
  const Key key{{xd[lead], xd[lead + 1], xd[lead + 2], xd[lead + 3], gd[lead + 1], gd[lead + 2],
                 gd[lead + 3], kd[lead], kd[lead + 1], stride_h, stride_w, pad_h_lo, pad_h_hi,
                 pad_w_lo, pad_w_hi}};
  if (gd[lead] != xd[lead] || kd[lead + 2] != xd[lead + 3] || kd[lead + 3] != gd[lead + 3])
    return ffi::Error::InvalidArgument("onednn kernel grad: x, g and dk shapes disagree");
  try {
    const Plan& p = GetPlan(key);
    // No lock: with user-managed scratchpads a cached primitive may run on several threads at
    // once (oneDNN's dnnl::scratchpad_mode::user), each with its own thread's buffer.
    void* scratch = ThreadScratch(p.scratch_bytes);
    dnnl::stream stream(Engine());
    const size_t x_size = p.x_user.get_size() / sizeof(float);
    const size_t g_size = p.g_user.get_size() / sizeof(float);
    const size_t k_size = p.dk_user.get_size() / sizeof(float);
    dnnl::memory x_tmp, g_tmp, dk_tmp;
    if (p.x_reorder) x_tmp = dnnl::memory(p.x_prim, Engine());
    if (p.g_reorder) g_tmp = dnnl::memory(p.g_prim, Engine());
    if (p.dk_reorder) dk_tmp = dnnl::memory(p.dk_prim, Engine());
    for (int64_t i = 0; i < n; ++i) {
      dnnl::memory x_mem(p.x_user, Engine(), x.typed_data() + i * x_size);
      dnnl::memory g_mem(p.g_user, Engine(), g.typed_data() + i * g_size);
      dnnl::memory dk_mem(p.dk_user, Engine(), dk->typed_data() + i * k_size);
      if (p.x_reorder)
        Execute(*p.x_reorder, stream, {{DNNL_ARG_FROM, x_mem}, {DNNL_ARG_TO, x_tmp}},
                p.x_scratch, scratch);
      if (p.g_reorder)
        Execute(*p.g_reorder, stream, {{DNNL_ARG_FROM, g_mem}, {DNNL_ARG_TO, g_tmp}},
                p.g_scratch, scratch);
      Execute(p.conv, stream,
              {{DNNL_ARG_SRC, p.x_reorder ? x_tmp : x_mem},
               {DNNL_ARG_DIFF_DST, p.g_reorder ? g_tmp : g_mem},
               {DNNL_ARG_DIFF_WEIGHTS, p.dk_reorder ? dk_tmp : dk_mem}},
              p.conv_scratch, scratch);
      if (p.dk_reorder)
        Execute(*p.dk_reorder, stream, {{DNNL_ARG_FROM, dk_tmp}, {DNNL_ARG_TO, dk_mem}},
                p.dk_scratch, scratch);
    }
    stream.wait();
  } catch (const dnnl::error& e) {
    return ffi::Error::Internal(std::string("oneDNN convolution backward weights: ") + e.what());
  } catch (const std::exception& e) {  // e.g. bad_alloc: an error for XLA, never an abort
    return ffi::Error::Internal(std::string("onednn kernel grad: ") + e.what());
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(FedjaxOnednnConvKernelGrad, KernelGrad,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("stride_h")
                                  .Attr<int64_t>("stride_w")
                                  .Attr<int64_t>("pad_h_lo")
                                  .Attr<int64_t>("pad_h_hi")
                                  .Attr<int64_t>("pad_w_lo")
                                  .Attr<int64_t>("pad_w_hi"));

// The oneDNN version the library was built against, read by the loader for its one-line report.
extern "C" const char* FedjaxOnednnVersion() {
  static std::string v = [] {
    const dnnl_version_t* ver = dnnl_version();
    return std::to_string(ver->major) + "." + std::to_string(ver->minor) + "." +
           std::to_string(ver->patch);
  }();
  return v.c_str();
}
