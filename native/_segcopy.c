/*
 * fusion_shim._segcopy: a memcpy that survives a SIGBUS, for the worker's copies into and out of a
 * client's shared-memory segment (docs/design.md D180).
 *
 * A client may truncate its own segment while the worker has it mapped; touching a page past the
 * file's new end raises SIGBUS. copy(dst, src) copies src into dst with this thread's guard armed:
 * a SIGBUS whose address lies in either buffer, raised on this thread while it copies, jumps back
 * to copy(), which returns False (the copy stopped part-way). Any other SIGBUS goes to the handler
 * that was installed before this module's (Python's faulthandler, say), or kills the process as it
 * would have without it.
 *
 * Invariants:
 * - The handler is installed at the first copy, with SA_SIGINFO, the previous one kept; each later
 *   copy checks that it is still in place and, where a library installed its own since
 *   (faulthandler enabled again, Python's signal module), puts it back in front of that one.
 * - The previous handler is called at most once per signal: one that raises the signal again
 *   (faulthandler does) reaches the default action, never a loop between the two.
 * - The guard is per thread (guard_jmp and the ranges: thread-local, initial-exec, so the handler
 *   reads them with plain loads), armed and disarmed around the copy behind signal fences, so the
 *   compiler cannot move the copy outside them. Between sigsetjmp and the end of the copy the
 *   thread runs memcpy alone: nothing it holds needs undoing when it jumps out.
 * - sigsetjmp saves the signal mask, so the jump out of the handler unblocks SIGBUS again.
 * - The GIL is released during the copy; the buffers are held (Py_buffer) until it ends.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <string.h>

/* initial-exec: the handler reads these with a plain load (a dynamic TLS look-up may allocate) */
#define THREAD_LOCAL _Thread_local __attribute__((tls_model("initial-exec")))

static THREAD_LOCAL sigjmp_buf *volatile guard_jmp;   /* this thread's copy in progress, or NULL */
static THREAD_LOCAL const char *volatile guard_lo[2]; /* the two buffers it copies between */
static THREAD_LOCAL const char *volatile guard_hi[2];
static struct sigaction previous;             /* the SIGBUS handler before ours */
static int installed;
static volatile sig_atomic_t chaining;        /* a SIGBUS is being passed to the previous handler */
static Py_ssize_t faults;                     /* copies a SIGBUS stopped, since the module loaded */

static int ours(const char *addr)
{
    for (int i = 0; i < 2; i++)
        if (addr >= guard_lo[i] && addr < guard_hi[i])
            return 1;
    return 0;
}

static void on_sigbus(int sig, siginfo_t *info, void *context)
{
    /* si_code > 0: raised by the kernel for a fault at si_addr (not sent by kill) */
    if (guard_jmp != NULL && info != NULL && info->si_code > 0 && ours((const char *)info->si_addr))
        siglongjmp(*guard_jmp, 1);
    /* not a fault of a guarded copy: what would have happened without this module */
    if (!chaining) {
        chaining = 1;
        if (previous.sa_flags & SA_SIGINFO) {
            previous.sa_sigaction(sig, info, context);
            chaining = 0;
            return;
        }
        if (previous.sa_handler == SIG_IGN) {
            chaining = 0;
            return;
        }
        if (previous.sa_handler != SIG_DFL) {
            previous.sa_handler(sig);
            chaining = 0;
            return;
        }
    }
    signal(sig, SIG_DFL);  /* the default action: the process ends, as it would have */
    raise(sig);
}

static int install(void)
{
    struct sigaction sa, now;
    if (installed && sigaction(SIGBUS, NULL, &now) == 0 && (now.sa_flags & SA_SIGINFO)
            && now.sa_sigaction == on_sigbus)
        return 0;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    /* SIGBUS blocked while `previous` changes: the handler never reads it half-written */
    sigset_t bus, old;
    sigemptyset(&bus);
    sigaddset(&bus, SIGBUS);
    pthread_sigmask(SIG_BLOCK, &bus, &old);
    int failed = sigaction(SIGBUS, &sa, &now) != 0;
    if (!failed)
        previous = now;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (failed) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    installed = 1;
    return 0;
}

static int guarded_memcpy(char *dst, const char *src, size_t n)
{
    sigjmp_buf jump;
    if (sigsetjmp(jump, 1) != 0) {
        guard_jmp = NULL;
        return -1;
    }
    guard_lo[0] = dst;
    guard_hi[0] = dst + n;
    guard_lo[1] = src;
    guard_hi[1] = src + n;
    guard_jmp = &jump;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);  /* the guard is armed before the copy's first load */
    memcpy(dst, src, n);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);  /* ... and disarmed after its last store */
    guard_jmp = NULL;
    return 0;
}

static PyObject *m_copy(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer dst, src;
    int failed;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "copy(dst, src) takes two buffers");
        return NULL;
    }
    if (install() < 0)
        return NULL;
    if (PyObject_GetBuffer(args[0], &dst, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &src, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&dst);
        return NULL;
    }
    if (dst.len != src.len) {
        PyErr_Format(PyExc_ValueError, "copy of %zd bytes into %zd", src.len, dst.len);
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    failed = guarded_memcpy((char *)dst.buf, (const char *)src.buf, (size_t)src.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (failed)
        faults++;
    return PyBool_FromLong(!failed);
}

static PyObject *m_faults(PyObject *self, PyObject *unused)
{
    return PyLong_FromSsize_t(faults);
}

static PyMethodDef methods[] = {
    {"copy", (PyCFunction)(void (*)(void))m_copy, METH_FASTCALL,
     "copy(dst, src) -> bool: src's bytes into dst (same length); False where a SIGBUS stopped it."},
    {"faults", m_faults, METH_NOARGS, "Copies a SIGBUS stopped since the module was loaded."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_segcopy", NULL, -1, methods};

PyMODINIT_FUNC PyInit__segcopy(void)
{
    return PyModule_Create(&module);
}
