// The fibers of emu.h (Note [Emulated threads]): each CUDA thread of a block runs on its own
// stack on the launching host thread. On x86-64 a switch saves the callee-saved registers and the
// stack pointer (emu_switch below); elsewhere ucontext's swapcontext does the same, slower. Under
// ASan every switch is announced (__sanitizer_start/finish_switch_fiber), so ASan knows which
// stack is current and the kernels' stack frames keep their red zones.
#include <sys/mman.h>

#include <cstring>

#include "emu.h"

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace {

#if defined(__x86_64__)
// emu_switch(save, to): pushes the System V callee-saved registers, MXCSR and the x87 control
// word, stores the stack pointer in *save, loads `to` and pops the same from there.
extern "C" void emu_switch(void** save, void* to);
asm(R"(
  .pushsection .text
  .p2align 4
  .type emu_switch, @function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $16, %rsp
  stmxcsr 8(%rsp)
  fnstcw 12(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr 8(%rsp)
  fldcw 12(%rsp)
  addq $16, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch, .-emu_switch
  .popsection
)");
#endif

// A fiber's stack: 256 KiB (an ASan-instrumented kernel frame with its 64 accumulators and tree
// stack is a few KiB) above a PROT_NONE guard page, so an overflow faults instead of writing into
// the next stack.
constexpr std::size_t kStack = 256 * 1024, kGuard = 4096;

}  // namespace

struct EmuFibers::Fiber {
  char* base = nullptr;  // the guard page; the stack is [base + kGuard, base + kGuard + kStack)
  void* sp = nullptr;    // saved stack pointer while switched out
  void* fake = nullptr;  // ASan's fake stack while switched out
  EmuBarrier* waiting = nullptr;
  unsigned phase = 0;
  bool done = true;
#if !defined(__x86_64__)
  ucontext_t uc;
#endif
  char* lo() const { return base + kGuard; }
  char* hi() const { return base + kGuard + kStack; }
};

#if !defined(__x86_64__)
namespace {
ucontext_t main_uc;
}
#endif

EmuFibers::~EmuFibers() {
  for (Fiber* f : fibers_) {
    munmap(f->base, kGuard + kStack);
    delete f;
  }
}

void EmuFibers::entry() {
  EmuFibers& s = emu_fibers;
#ifdef EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &s.main_bottom_, &s.main_size_);
#endif
  try {
    s.body_(s.cur_, s.ctx_);
  } catch (...) {
    if (!s.error_) s.error_ = std::current_exception();
  }
  s.fibers_[s.cur_]->done = true;
  s.to_scheduler(true);
  std::abort();  // a finished fiber is never resumed
}

void EmuFibers::resume(unsigned i) {
  Fiber& f = *fibers_[i];
  cur_ = i;
#ifdef EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.lo(), kStack);
#endif
#if defined(__x86_64__)
  emu_switch(&main_sp_, f.sp);
#else
  swapcontext(&main_uc, &f.uc);
#endif
#ifdef EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

void EmuFibers::to_scheduler(bool dying) {
  Fiber& f = *fibers_[cur_];
#ifdef EMU_ASAN
  __sanitizer_start_switch_fiber(dying ? nullptr : &f.fake, main_bottom_, main_size_);
#else
  (void)dying;
#endif
#if defined(__x86_64__)
  emu_switch(&f.sp, main_sp_);
#else
  swapcontext(&f.uc, &main_uc);
#endif
#ifdef EMU_ASAN
  __sanitizer_finish_switch_fiber(f.fake, &main_bottom_, &main_size_);
#endif
}

void EmuFibers::wait(EmuBarrier& b) {
  Fiber& f = *fibers_[cur_];
  f.waiting = &b;
  f.phase = b.phase_;
  to_scheduler(false);
}

void EmuFibers::run(unsigned n, void (*enter)(unsigned, void*), void (*body)(unsigned, void*),
                    void* ctx, bool backward_first) {
  while (fibers_.size() < n) {
    void* m = mmap(nullptr, kGuard + kStack, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) throw std::runtime_error("cuda_emu: mmap of a fiber stack failed");
    mprotect(m, kGuard, PROT_NONE);
    Fiber* f = new Fiber;
    f->base = static_cast<char*>(m);
    fibers_.push_back(f);
  }
  body_ = body;
  ctx_ = ctx;
  error_ = nullptr;
  for (unsigned i = 0; i < n; ++i) {
    Fiber& f = *fibers_[i];
    f.done = false;
    f.waiting = nullptr;
    f.fake = nullptr;
#if defined(__x86_64__)
    // The frame emu_switch pops: MXCSR and x87 control word (the scheduler's), six registers
    // (rbp 0 ends ASan's frame-pointer unwinding), then `ret` into entry with the stack aligned
    // as after a call (a zero return address above it).
    auto* top = reinterpret_cast<std::uint64_t*>(f.hi());
    *--top = 0;
    *--top = reinterpret_cast<std::uint64_t>(&EmuFibers::entry);
    for (int r = 0; r < 6; ++r) *--top = 0;
    top -= 2;
    std::uint32_t mxcsr = 0;
    std::uint16_t fpcw = 0;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpcw));
    std::memcpy(reinterpret_cast<char*>(top) + 8, &mxcsr, 4);
    std::memcpy(reinterpret_cast<char*>(top) + 12, &fpcw, 2);
    f.sp = top;
#else
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = f.lo();
    f.uc.uc_stack.ss_size = kStack;
    f.uc.uc_link = nullptr;
    makecontext(&f.uc, &EmuFibers::entry, 0);
#endif
  }
  unsigned left = n;
  bool backward = backward_first;
  while (left > 0) {
    bool ran = false;
    for (unsigned s = 0; s < n; ++s) {
      const unsigned i = backward ? n - 1 - s : s;
      Fiber& f = *fibers_[i];
      if (f.done) continue;
      if (f.waiting) {
        if (f.waiting->phase_ == f.phase) continue;  // its barrier has not released yet
        f.waiting = nullptr;
      }
      enter(i, ctx);
      resume(i);
      ran = true;
      if (f.done) {
        --left;
#ifdef EMU_ASAN
        // The dead fiber's frames leave their red zones poisoned; the next block reuses the stack.
        // Only its entry frame is live at the end: unpoison the top of the stack it used.
        char* used = f.lo();
        if (f.sp && static_cast<char*>(f.sp) - f.lo() > 4096)
          used = static_cast<char*>(f.sp) - 4096;
        ASAN_UNPOISON_MEMORY_REGION(used, static_cast<std::size_t>(f.hi() - used));
#endif
      }
    }
    if (!ran) {
#ifdef EMU_ASAN
      for (unsigned i = 0; i < n; ++i)  // abandoned mid-kernel: whole stacks
        if (!fibers_[i]->done) ASAN_UNPOISON_MEMORY_REGION(fibers_[i]->lo(), kStack);
#endif
      for (unsigned i = 0; i < n; ++i) fibers_[i]->done = true;
      if (error_) std::rethrow_exception(error_);
      throw std::runtime_error(
          "cuda_emu: the threads of a block wait at different barriers (a __syncthreads or "
          "__syncwarp that not every thread reaches)");
    }
    backward = !backward;
  }
  if (error_) std::rethrow_exception(error_);
}
