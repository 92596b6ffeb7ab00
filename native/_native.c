/*
 * fusion_shim._native: C trampolines for ndarray's `@`, `@=` and `.dot`, and a C fast path for the
 * wrapped module functions.
 *
 * ndarray is a static type: Python cannot patch its methods, so `a @ b` never reaches a wrapped
 * np.matmul. This module swaps three C entries of NumPy's own tables for trampolines:
 *   PyArray_Type.tp_as_number->nb_matrix_multiply          a @ b
 *   PyArray_Type.tp_as_number->nb_inplace_matrix_multiply  a @= b
 *   the PyMethodDef behind the method descriptor ndarray.dot: ml_meth    a.dot(b, out=None)
 *
 * Invariants:
 * - A trampoline calls NumPy's original at once unless both operands are exact ndarrays with one
 *   dimension or more, their input bytes reach the floor the planner publishes (set_floor), a
 *   callback is set, this thread is not already inside the shim or inside an intercepted call
 *   (tls_depth), and the calling frame is not a library's own (set_libraries). Only then does it
 *   call the Python callback cb(a, b, out_or_None, kind), which returns the result, or LOCAL:
 *   "NumPy's original, here".
 * - Local computation always goes through NumPy's original C entry (here or through original()),
 *   so NumPy's exact semantics and errors reach the program; nothing re-enters a trampoline.
 * - install() patches only when every entry is NumPy's own: the slots equal what ndarray's slot
 *   wrappers hold, the descriptor is the expected one, and all three functions live in the shared
 *   object that defines PyArray_Type. Otherwise nothing is patched and the reason is raised.
 * - uninstall() puts back exactly the saved pointers. The trampolines stay valid (the module is
 *   never unloaded) and pass through once the callback is unset. Subclasses never hold them: a
 *   class created while installed takes its @ slot from the slot wrapper (NumPy's function), and
 *   reaches tramp_dot only through the shared descriptor, as a non-exact ndarray (pass-through).
 *   So NumPy's BINOP_GIVE_UP_IF_NEEDED, which compares the other operand's slot with its own
 *   function, decides as it would without the shim.
 * - D285: an intercepted call is the program's only when made by the program: every call counted or
 *   sent to the shim runs with tls_depth raised, so the calls NumPy and SciPy make inside it pass
 *   through uncounted under every policy, and so do calls whose calling Python frame belongs to a
 *   library (its module's __name__ is one of set_libraries' names or below one, but not in a
 *   `tests` package: a library's own test suite is a program).
 * - All state is touched with the GIL held (CPython 3.10-3.12; no free-threaded build).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <structmember.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#if defined(__unix__) || defined(__APPLE__)
#include <dlfcn.h>
#define HAVE_DLADDR 1
#endif
#if defined(_MSC_VER)
#define THREAD_LOCAL __declspec(thread)
#else
#define THREAD_LOCAL _Thread_local
#endif

#define INTERFACE 4  /* bump when the Python side's use of this module changes (loader checks it) */
enum { K_MATMUL = 0, K_IMATMUL = 1, K_DOT = 2 };
#define DOT_FLAGS (METH_FASTCALL | METH_KEYWORDS)
typedef PyObject *(*dotfunc)(PyObject *, PyObject *const *, Py_ssize_t, PyObject *);

static binaryfunc orig_matmul, orig_imatmul;  /* NumPy's entries, saved at the first install */
static dotfunc orig_dot;
static PyMethodDef *dot_def;                   /* NumPy's static array_methods["dot"] */
static int patched;
static Py_ssize_t floor_bytes = -1;            /* < 0: pass everything through; 0: nothing below */
static Py_ssize_t op_floor[3];                 /* each operator's own floor, when above floor_bytes */
static PyObject *callback;                     /* strong reference, or NULL */
static PyObject *LOCAL;                        /* the callback's "compute it here" answer */
static Py_ssize_t below_floor[3];              /* calls kept local by the floor, per kind */
static THREAD_LOCAL int tls_depth;             /* > 0 while this thread runs the shim or an intercepted call */
static PyObject *libraries;                    /* tuple of module names whose frames' calls pass through */
static PyObject *last_name;                    /* the caller module name last classified (strong), and: */
static int last_is_library;
static PyObject *str_name;                     /* "__name__", interned */
static PyObject *tests_dot, *tests_end;        /* ".tests." and ".tests": a library's test modules */

/* 1 when the calling Python frame's module is a library's own (numpy, scipy, or below them). */
static int library_caller(void)
{
    PyObject *globals = PyEval_GetGlobals();  /* borrowed; the innermost Python frame's */
    if (globals == NULL || libraries == NULL) {
        return 0;
    }
    PyObject *name = PyDict_GetItemWithError(globals, str_name);  /* borrowed */
    if (name == NULL || !PyUnicode_Check(name)) {
        PyErr_Clear();
        return 0;
    }
    if (name == last_name) {
        return last_is_library;
    }
    int found = 0;
    Py_ssize_t n = PyUnicode_GET_LENGTH(name);
    for (Py_ssize_t i = 0; !found && i < PyTuple_GET_SIZE(libraries); i++) {
        PyObject *lib = PyTuple_GET_ITEM(libraries, i);
        Py_ssize_t k = PyUnicode_GET_LENGTH(lib);
        found = n >= k && PyUnicode_Tailmatch(name, lib, 0, k, -1) == 1
                && (n == k || PyUnicode_READ_CHAR(name, k) == '.');
    }
    if (found) {  /* a library's own test suite is a program that calls it */
        found = !(tests_dot != NULL && PyUnicode_Find(name, tests_dot, 0, n, 1) >= 0)
                && !(tests_end != NULL && PyUnicode_Tailmatch(name, tests_end, 0, n, 1) == 1);
        PyErr_Clear();
    }
    Py_XSETREF(last_name, Py_NewRef(name));
    last_is_library = found;
    return found;
}

static inline Py_ssize_t nbytes(PyArrayObject *a)
{
    Py_ssize_t n = PyArray_ITEMSIZE(a);
    for (int i = 0; i < PyArray_NDIM(a); i++) {
        n *= PyArray_DIM(a, i);
    }
    return n;
}

/* 1 when the call is for the shim's Python path; 0: NumPy's original, now. */
static inline int wanted(PyObject *a, PyObject *b, int kind)
{
    if (floor_bytes < 0 || tls_depth || callback == NULL
            || Py_TYPE(a) != &PyArray_Type || Py_TYPE(b) != &PyArray_Type
            || PyArray_NDIM((PyArrayObject *)a) == 0 || PyArray_NDIM((PyArrayObject *)b) == 0
            || library_caller()) {
        return 0;  /* 0-d operands: an error for @, a scalar multiply for .dot; NumPy's alone */
    }
    Py_ssize_t floor = op_floor[kind] > floor_bytes ? op_floor[kind] : floor_bytes;
    if (floor > 0 && nbytes((PyArrayObject *)a) + nbytes((PyArrayObject *)b) < floor) {
        below_floor[kind]++;
        return 0;
    }
    return 1;
}

/* cb(a, b, out, kind) with the re-entrancy depth raised; a new reference, LOCAL, or NULL. */
static PyObject *call_python(PyObject *a, PyObject *b, PyObject *out, int kind)
{
    PyObject *cb = callback, *pykind = PyLong_FromLong(kind), *res;
    if (pykind == NULL) {
        return NULL;
    }
    PyObject *args[4] = {a, b, out ? out : Py_None, pykind};
    Py_INCREF(cb);  /* uninstall() may drop the module's reference while this call runs */
    tls_depth++;
    res = PyObject_Vectorcall(cb, args, 4, NULL);
    tls_depth--;
    Py_DECREF(cb);
    Py_DECREF(pykind);
    return res;
}

/* NumPy's own entry with the depth raised: nothing it calls back into is counted (D285). */
#define INSIDE(call) (tls_depth++, res = (call), tls_depth--, res)

static PyObject *tramp_matmul(PyObject *a, PyObject *b)
{
    PyObject *res;
    if (!wanted(a, b, K_MATMUL)) {
        return INSIDE(orig_matmul(a, b));
    }
    res = call_python(a, b, NULL, K_MATMUL);
    if (res == LOCAL) {
        Py_DECREF(res);
        return orig_matmul(a, b);
    }
    return res;
}

static PyObject *tramp_imatmul(PyObject *a, PyObject *b)
{
    PyObject *res;
    if (!wanted(a, b, K_IMATMUL)) {
        return INSIDE(orig_imatmul(a, b));
    }
    res = call_python(a, b, NULL, K_IMATMUL);
    if (res == LOCAL) {
        Py_DECREF(res);
        return orig_imatmul(a, b);
    }
    return res;
}

static PyObject *call_dot(PyObject *self, PyObject *b, PyObject *out)
{
    PyObject *args[2] = {b, out};
    return orig_dot(self, args, out ? 2 : 1, NULL);
}

/* a.dot(b), a.dot(b, out) and a.dot(b, out=out) are offered to the shim; any other spelling
 * goes to NumPy untouched (NumPy parses it and raises its own error if it is wrong). */
static PyObject *tramp_dot(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *out = NULL;
    if (nargs == 2 && nkw == 0) {
        out = args[1];
    }
    else if (nargs == 1 && nkw == 1) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, 0);
        if (!PyUnicode_Check(name) || PyUnicode_CompareWithASCIIString(name, "out") != 0) {
            return orig_dot(self, args, nargs, kwnames);
        }
        out = args[1];
    }
    else if (nargs != 1 || nkw != 0) {
        return orig_dot(self, args, nargs, kwnames);
    }
    if (out == Py_None) {
        out = NULL;
    }
    PyObject *res;
    if (!wanted(self, args[0], K_DOT)) {
        return INSIDE(orig_dot(self, args, nargs, kwnames));
    }
    res = call_python(self, args[0], out, K_DOT);
    if (res == LOCAL) {
        Py_DECREF(res);
        return orig_dot(self, args, nargs, kwnames);
    }
    return res;
}

/* ---- checks before patching ----------------------------------------------------------------- */

static void *wrapped_slot(const char *name, int offset, const char **why)
{
    PyObject *d = PyDict_GetItemString(PyArray_Type.tp_dict, name);  /* borrowed */
    if (d == NULL || !Py_IS_TYPE(d, &PyWrapperDescr_Type)) {
        *why = "a slot wrapper of ndarray is missing or not a wrapper_descriptor";
        return NULL;
    }
    PyWrapperDescrObject *w = (PyWrapperDescrObject *)d;
    if (w->d_base == NULL || w->d_base->offset != offset || PyDescr_TYPE(w) != &PyArray_Type) {
        *why = "a slot wrapper of ndarray does not describe the expected slot";
        return NULL;
    }
    return w->d_wrapped;
}

#ifdef HAVE_DLADDR
static const void *object_base(const void *p)
{
    Dl_info info;
    return dladdr(p, &info) ? info.dli_fbase : NULL;
}
#endif

/* NULL when every entry is NumPy's own; else why not. Sets dot_def. */
static const char *check_entries(void)
{
    const char *why = NULL;
    PyNumberMethods *nb = PyArray_Type.tp_as_number;
    if (nb == NULL) {
        return "ndarray has no number methods";
    }
    void *mm = wrapped_slot("__matmul__", offsetof(PyHeapTypeObject, as_number.nb_matrix_multiply), &why);
    void *rmm = mm ? wrapped_slot("__rmatmul__", offsetof(PyHeapTypeObject, as_number.nb_matrix_multiply), &why) : NULL;
    void *imm = rmm ? wrapped_slot("__imatmul__", offsetof(PyHeapTypeObject, as_number.nb_inplace_matrix_multiply), &why) : NULL;
    if (imm == NULL) {
        return why;
    }
    if ((void *)nb->nb_matrix_multiply != mm || mm != rmm || (void *)nb->nb_inplace_matrix_multiply != imm) {
        return "ndarray's @ or @= slot is not what its slot wrapper holds (patched by someone else?)";
    }
    PyObject *d = PyDict_GetItemString(PyArray_Type.tp_dict, "dot");
    if (d == NULL || !Py_IS_TYPE(d, &PyMethodDescr_Type) || PyDescr_TYPE(d) != &PyArray_Type) {
        return "ndarray.dot is not a method descriptor";
    }
    PyMethodDef *def = ((PyMethodDescrObject *)d)->d_method;
    if (def == NULL || strcmp(def->ml_name, "dot") != 0 || def->ml_flags != DOT_FLAGS) {
        return "ndarray.dot is not a METH_FASTCALL|METH_KEYWORDS method named dot";
    }
#ifdef HAVE_DLADDR
    const void *numpy_so = object_base(&PyArray_Type);
    if (numpy_so == NULL || object_base((void *)mm) != numpy_so || object_base((void *)imm) != numpy_so
            || object_base((void *)def->ml_meth) != numpy_so) {
        return "an entry to replace does not live in NumPy's own shared object";
    }
#else
    return "cannot verify NumPy's entries on this platform (no dladdr)";
#endif
    dot_def = def;
    return NULL;
}

/* ---- module functions ----------------------------------------------------------------------- */

static PyObject *m_install(PyObject *mod, PyObject *unused)
{
    if (patched) {
        Py_RETURN_NONE;
    }
    const char *why = check_entries();
    if (why != NULL) {
        PyErr_SetString(PyExc_RuntimeError, why);
        return NULL;
    }
    orig_matmul = PyArray_Type.tp_as_number->nb_matrix_multiply;
    orig_imatmul = PyArray_Type.tp_as_number->nb_inplace_matrix_multiply;
    orig_dot = (dotfunc)(void (*)(void))dot_def->ml_meth;
    PyArray_Type.tp_as_number->nb_matrix_multiply = tramp_matmul;
    PyArray_Type.tp_as_number->nb_inplace_matrix_multiply = tramp_imatmul;
    dot_def->ml_meth = (PyCFunction)(void (*)(void))tramp_dot;
    PyType_Modified(&PyArray_Type);  /* drop cached lookups on the type */
    patched = 1;
    Py_RETURN_NONE;
}

static PyObject *m_uninstall(PyObject *mod, PyObject *unused)
{
    if (!patched) {
        Py_RETURN_FALSE;
    }
    /* Restore only entries that still hold our trampolines: never clobber a later patcher. */
    int clean = 1;
    PyNumberMethods *nb = PyArray_Type.tp_as_number;
    if (nb->nb_matrix_multiply == tramp_matmul) nb->nb_matrix_multiply = orig_matmul; else clean = 0;
    if (nb->nb_inplace_matrix_multiply == tramp_imatmul) nb->nb_inplace_matrix_multiply = orig_imatmul; else clean = 0;
    if (dot_def->ml_meth == (PyCFunction)(void (*)(void))tramp_dot) dot_def->ml_meth = (PyCFunction)(void (*)(void))orig_dot; else clean = 0;
    PyType_Modified(&PyArray_Type);
    patched = 0;
    if (!clean) {
        PyErr_SetString(PyExc_RuntimeError, "an entry was replaced by someone else after install; left as found");
        return NULL;
    }
    Py_RETURN_TRUE;
}

static PyObject *m_patched(PyObject *mod, PyObject *unused)
{
    return PyBool_FromLong(patched);
}

static PyObject *m_set_callback(PyObject *mod, PyObject *cb)
{
    if (cb != Py_None && !PyCallable_Check(cb)) {
        PyErr_SetString(PyExc_TypeError, "callback must be callable or None");
        return NULL;
    }
    PyObject *old = callback;
    callback = cb == Py_None ? NULL : Py_NewRef(cb);
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

static PyObject *m_set_floor(PyObject *mod, PyObject *arg)
{
    Py_ssize_t v = PyLong_AsSsize_t(arg);
    if (v == -1 && PyErr_Occurred()) {
        return NULL;
    }
    floor_bytes = v < 0 ? -1 : v;
    Py_RETURN_NONE;
}

static PyObject *m_get_floor(PyObject *mod, PyObject *unused)
{
    return PyLong_FromSsize_t(floor_bytes);
}

/* set_op_floors((matmul, imatmul, dot)): each operator's own floor, used where it is
 * above the published one; (0, 0, 0) leaves the published floor alone. */
static PyObject *m_set_op_floors(PyObject *mod, PyObject *arg)
{
    Py_ssize_t v[3];
    if (!PyArg_ParseTuple(arg, "nnn:set_op_floors", &v[0], &v[1], &v[2])) {
        return NULL;
    }
    for (int i = 0; i < 3; i++) {
        op_floor[i] = v[i] < 0 ? 0 : v[i];
    }
    Py_RETURN_NONE;
}

static PyObject *m_get_op_floors(PyObject *mod, PyObject *unused)
{
    return Py_BuildValue("(nnn)", op_floor[0], op_floor[1], op_floor[2]);
}

/* original(kind, a, b, out): NumPy's own entry, for the shim's local path (never a trampoline). */
static PyObject *m_original(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "original(kind, a, b, out)");
        return NULL;
    }
    long kind = PyLong_AsLong(args[0]);
    if (kind == -1 && PyErr_Occurred()) {
        return NULL;
    }
    binaryfunc mm = patched ? orig_matmul : PyArray_Type.tp_as_number->nb_matrix_multiply;
    binaryfunc imm = patched ? orig_imatmul : PyArray_Type.tp_as_number->nb_inplace_matrix_multiply;
    switch (kind) {
    case K_MATMUL:
        return mm(args[1], args[2]);
    case K_IMATMUL:
        return imm(args[1], args[2]);
    case K_DOT:
        if (!patched) {
            return PyObject_CallMethod(args[1], "dot", "OO", args[2], args[3]);
        }
        return call_dot(args[1], args[2], args[3] == Py_None ? NULL : args[3]);
    }
    PyErr_SetString(PyExc_ValueError, "kind must be 0 (@), 1 (@=) or 2 (.dot)");
    return NULL;
}

/* entries(): the current (nb_matrix_multiply, nb_inplace_matrix_multiply, dot ml_meth) addresses,
 * and what ndarray's slot wrappers hold for the first two; for tests of an exact restore. */
static PyObject *m_entries(PyObject *mod, PyObject *unused)
{
    const char *why;
    PyObject *d = PyDict_GetItemString(PyArray_Type.tp_dict, "dot");
    void *dot = (d && Py_IS_TYPE(d, &PyMethodDescr_Type)) ? (void *)((PyMethodDescrObject *)d)->d_method->ml_meth : NULL;
    void *mm = wrapped_slot("__matmul__", offsetof(PyHeapTypeObject, as_number.nb_matrix_multiply), &why);
    void *imm = wrapped_slot("__imatmul__", offsetof(PyHeapTypeObject, as_number.nb_inplace_matrix_multiply), &why);
    return Py_BuildValue("(nnn)(nn)", (Py_ssize_t)PyArray_Type.tp_as_number->nb_matrix_multiply,
                         (Py_ssize_t)PyArray_Type.tp_as_number->nb_inplace_matrix_multiply, (Py_ssize_t)dot,
                         (Py_ssize_t)mm, (Py_ssize_t)imm);
}

/* enter()/leave(): raise and lower this thread's depth (intercept.bypassed(): NumPy untouched). */
static PyObject *m_enter(PyObject *mod, PyObject *unused)
{
    tls_depth++;
    Py_RETURN_NONE;
}

static PyObject *m_leave(PyObject *mod, PyObject *unused)
{
    if (tls_depth > 0) {
        tls_depth--;
    }
    Py_RETURN_NONE;
}

/* set_libraries(names): calls from frames of these modules, or modules below them, pass through. */
static PyObject *m_set_libraries(PyObject *mod, PyObject *arg)
{
    if (!PyTuple_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "set_libraries takes a tuple of module names");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(arg); i++) {
        if (!PyUnicode_Check(PyTuple_GET_ITEM(arg, i))) {
            PyErr_SetString(PyExc_TypeError, "set_libraries takes a tuple of module names");
            return NULL;
        }
    }
    Py_XSETREF(libraries, Py_NewRef(arg));
    Py_CLEAR(last_name);
    Py_RETURN_NONE;
}

/* library_caller(): whether the calling frame is a library's (for tests). */
static PyObject *m_library_caller(PyObject *mod, PyObject *unused)
{
    return PyBool_FromLong(library_caller());
}

static PyObject *m_counts(PyObject *mod, PyObject *unused)
{
    return Py_BuildValue("(nnn)", below_floor[0], below_floor[1], below_floor[2]);
}

static PyObject *m_reset_counts(PyObject *mod, PyObject *unused)
{
    below_floor[0] = below_floor[1] = below_floor[2] = 0;
    Py_RETURN_NONE;
}

/* ---- FastCall: the floor check of a wrapped module function, in C ----------------------------
 * FastCall(wrapped, slow) is put as __call__ on a wrapt.ObjectProxy subclass (it is not a
 * descriptor, so it is called without the proxy). Same rule as the trampolines: under the floor,
 * or while this thread is inside the shim, call NumPy's function; else slow(*args, **kwargs)
 * with the re-entrancy depth raised, so that NumPy's own work inside it is never intercepted. */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *wrapped;
    PyObject *slow;
    Py_ssize_t below;  /* calls kept local by the floor (the report reads it) */
    Py_ssize_t floor;  /* this function's own floor, used where above the published one */
} FastCall;

static PyObject *fastcall_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    FastCall *self = (FastCall *)op;
    Py_ssize_t floor = floor_bytes;
    PyObject *res;
    if (floor < 0 || tls_depth || library_caller()) {
        return PyObject_Vectorcall(self->wrapped, args, nargsf, kwnames);
    }
    if (self->floor > floor) {
        floor = self->floor;
    }
    if (floor > 0) {
        Py_ssize_t n = PyVectorcall_NARGS(nargsf) + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
        Py_ssize_t total = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (Py_TYPE(args[i]) == &PyArray_Type) {
                total += nbytes((PyArrayObject *)args[i]);
            }
        }
        if (total < floor) {
            self->below++;
            return INSIDE(PyObject_Vectorcall(self->wrapped, args, nargsf, kwnames));
        }
    }
    tls_depth++;
    res = PyObject_Vectorcall(self->slow, args, nargsf, kwnames);
    tls_depth--;
    return res;
}

static PyObject *fastcall_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *wrapped, *slow;
    if (!PyArg_ParseTuple(args, "OO:FastCall", &wrapped, &slow)) {
        return NULL;
    }
    FastCall *self = (FastCall *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = fastcall_vectorcall;
    self->wrapped = Py_NewRef(wrapped);
    self->slow = Py_NewRef(slow);
    return (PyObject *)self;
}

static int fastcall_traverse(FastCall *self, visitproc visit, void *arg)
{
    Py_VISIT(self->wrapped);
    Py_VISIT(self->slow);
    return 0;
}

static int fastcall_clear(FastCall *self)
{
    Py_CLEAR(self->wrapped);
    Py_CLEAR(self->slow);
    return 0;
}

static void fastcall_dealloc(FastCall *self)
{
    PyObject_GC_UnTrack(self);
    fastcall_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef fastcall_members[] = {
    {"wrapped", T_OBJECT, offsetof(FastCall, wrapped), READONLY, NULL},
    {"below", T_PYSSIZET, offsetof(FastCall, below), 0, "calls kept local by the floor"},
    {"floor", T_PYSSIZET, offsetof(FastCall, floor), 0, "this function's own floor, where above the published one"},
    {NULL}
};

static PyTypeObject FastCall_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fusion_shim._native.FastCall",
    .tp_basicsize = sizeof(FastCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(FastCall, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = fastcall_new,
    .tp_traverse = (traverseproc)fastcall_traverse,
    .tp_clear = (inquiry)fastcall_clear,
    .tp_dealloc = (destructor)fastcall_dealloc,
    .tp_members = fastcall_members,
    .tp_doc = "FastCall(wrapped, slow): the floor check of a wrapped module function, in C.",
};

/* ---- the proxy classes: wrapt's C ObjectProxy, called by vectorcall (D117) ------------------------
 * proxy_type(base) makes a subclass of wrapt's C ObjectProxy whose instances end in a vectorcall
 * pointer and the FastCall that set_call gives them: a call goes straight to the FastCall, with no
 * argument tuple and no lookup of __call__ (a Python class's __call__ costs both on every call). */

typedef struct {
    vectorcallfunc vectorcall;
    PyObject *fast;  /* the FastCall (or any callable) the proxy's calls go to */
} ProxyTail;

static PyTypeObject *proxy_base;   /* wrapt's C ObjectProxy */
static Py_ssize_t tail_offset;      /* where ProxyTail starts in a proxy */
static PyObject *proxy_types;      /* the types made, for set_call's check */

#define TAIL(o) ((ProxyTail *)((char *)(o) + tail_offset))

static PyObject *proxy_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *fast = TAIL(self)->fast;
    Py_INCREF(fast);  /* set_call may replace it during the call */
    PyObject *res = Py_TYPE(fast) == &FastCall_Type ? fastcall_vectorcall(fast, args, nargsf, kwnames)
                                                    : PyObject_Vectorcall(fast, args, nargsf, kwnames);
    Py_DECREF(fast);
    return res;
}

static PyObject *proxy_call(PyObject *self, PyObject *args, PyObject *kwargs)
{
    PyObject *fast = TAIL(self)->fast;
    if (fast == NULL) {
        PyErr_Format(PyExc_TypeError, "'%.200s' object is not callable", Py_TYPE(self)->tp_name);
        return NULL;
    }
    Py_INCREF(fast);
    PyObject *res = PyObject_Call(fast, args, kwargs);
    Py_DECREF(fast);
    return res;
}

static int proxy_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(TAIL(self)->fast);
    Py_VISIT(Py_TYPE(self));  /* a heap type's instances hold it */
    return proxy_base->tp_traverse(self, visit, arg);
}

static int proxy_clear(PyObject *self)
{
    Py_CLEAR(TAIL(self)->fast);
    return proxy_base->tp_clear(self);
}

static void proxy_dealloc(PyObject *self)
{
    PyObject_GC_UnTrack(self);
    Py_CLEAR(TAIL(self)->fast);
    proxy_base->tp_dealloc(self);  /* wrapt's: its weak references, its fields, tp_free, a heap type's reference */
}

/* proxy_type(base): a new proxy class, subclass of wrapt's C ObjectProxy ``base`` (the same base every time). */
static PyObject *m_proxy_type(PyObject *mod, PyObject *arg)
{
    if (!PyType_Check(arg) || ((PyTypeObject *)arg)->tp_itemsize != 0
            || ((PyTypeObject *)arg)->tp_traverse == NULL || ((PyTypeObject *)arg)->tp_clear == NULL) {
        PyErr_SetString(PyExc_TypeError, "proxy_type: wrapt's C ObjectProxy is needed");
        return NULL;
    }
    PyTypeObject *base = (PyTypeObject *)arg;
    if (proxy_base != NULL && base != proxy_base) {
        PyErr_SetString(PyExc_TypeError, "proxy_type: a different base than before");
        return NULL;
    }
    Py_ssize_t align = (Py_ssize_t)sizeof(void *);
    Py_ssize_t offset = (base->tp_basicsize + align - 1) / align * align;
    PyMemberDef members[] = {
        {"__vectorcalloffset__", T_PYSSIZET, offset + (Py_ssize_t)offsetof(ProxyTail, vectorcall), READONLY, NULL},
        {NULL}
    };
    PyType_Slot slots[] = {
        {Py_tp_call, proxy_call},
        {Py_tp_traverse, proxy_traverse},
        {Py_tp_clear, proxy_clear},
        {Py_tp_dealloc, proxy_dealloc},
        {Py_tp_members, members},
        {0, NULL}
    };
    PyType_Spec spec = {
        .name = "fusion_shim.intercept.native.FunctionProxy",
        .basicsize = (int)(offset + (Py_ssize_t)sizeof(ProxyTail)),
        .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
        .slots = slots,
    };
    if (proxy_types == NULL && (proxy_types = PyList_New(0)) == NULL) {
        return NULL;
    }
    PyObject *type = PyType_FromSpecWithBases(&spec, arg);
    if (type == NULL) {
        return NULL;
    }
    if (PyList_Append(proxy_types, type) < 0) {
        Py_DECREF(type);
        return NULL;
    }
    Py_INCREF(base);  /* held for the types' dealloc, traverse and clear */
    proxy_base = base;
    tail_offset = offset;
    return type;
}

/* set_call(proxy, fast): the proxy's calls go to ``fast`` from now on. */
static PyObject *m_set_call(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "set_call(proxy, callable)");
        return NULL;
    }
    int ours = 0;
    for (Py_ssize_t i = 0; proxy_types != NULL && i < PyList_GET_SIZE(proxy_types); i++) {
        ours |= PyObject_TypeCheck(args[0], (PyTypeObject *)PyList_GET_ITEM(proxy_types, i));
    }
    if (!ours) {
        PyErr_SetString(PyExc_TypeError, "set_call: not an instance of a proxy_type() class");
        return NULL;
    }
    ProxyTail *tail = TAIL(args[0]);
    PyObject *old = tail->fast;
    tail->fast = Py_NewRef(args[1]);
    tail->vectorcall = proxy_vectorcall;
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"install", m_install, METH_NOARGS, "Patch ndarray's @, @= and .dot; RuntimeError(why) if not NumPy's own."},
    {"uninstall", m_uninstall, METH_NOARGS, "Restore NumPy's entries; False if nothing was patched."},
    {"patched", m_patched, METH_NOARGS, "Whether the trampolines are in place."},
    {"set_callback", m_set_callback, METH_O, "cb(a, b, out, kind) -> result or LOCAL; None to unset."},
    {"set_floor", m_set_floor, METH_O, "Input bytes below which calls stay local; < 0: all; 0: none."},
    {"set_op_floors", m_set_op_floors, METH_O, "(@, @=, .dot): each operator's own floor where above set_floor's."},
    {"get_op_floors", m_get_op_floors, METH_NOARGS, "The operators' own floors."},
    {"get_floor", m_get_floor, METH_NOARGS, "The floor in bytes (-1: everything passes through)."},
    {"original", (PyCFunction)(void (*)(void))m_original, METH_FASTCALL, "NumPy's own @ (0), @= (1), .dot (2)."},
    {"entries", m_entries, METH_NOARGS, "((@, @=, dot) now, (@, @=) in the slot wrappers), as addresses."},
    {"enter", m_enter, METH_NOARGS, "This thread bypasses the shim until leave()."},
    {"leave", m_leave, METH_NOARGS, "Undo one enter()."},
    {"set_libraries", m_set_libraries, METH_O, "Module names whose frames' calls pass through uncounted."},
    {"library_caller", m_library_caller, METH_NOARGS, "Whether the calling frame is a library's own."},
    {"counts", m_counts, METH_NOARGS, "Calls kept local by the floor: (@, @=, .dot)."},
    {"reset_counts", m_reset_counts, METH_NOARGS, "Zero the floor counters (after fork)."},
    {"proxy_type", m_proxy_type, METH_O, "A proxy class over wrapt's C ObjectProxy, called by vectorcall."},
    {"set_call", (PyCFunction)(void (*)(void))m_set_call, METH_FASTCALL, "set_call(proxy, fast): where its calls go."},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "fusion_shim._native", "C trampolines for ndarray @, @= and .dot.",
    -1, methods,
};

PyMODINIT_FUNC PyInit__native(void)
{
    import_array();
    if (PyType_Ready(&FastCall_Type) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL) {
        return NULL;
    }
    if (LOCAL == NULL) {
        LOCAL = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
    }
    if ((str_name == NULL && (str_name = PyUnicode_InternFromString("__name__")) == NULL)
            || (tests_dot == NULL && (tests_dot = PyUnicode_FromString(".tests.")) == NULL)
            || (tests_end == NULL && (tests_end = PyUnicode_FromString(".tests")) == NULL)) {
        Py_DECREF(m);
        return NULL;
    }
    if (LOCAL == NULL || PyModule_AddObjectRef(m, "LOCAL", LOCAL) < 0
            || PyModule_AddObjectRef(m, "FastCall", (PyObject *)&FastCall_Type) < 0
            || PyModule_AddIntConstant(m, "INTERFACE", INTERFACE) < 0
            || PyModule_AddIntConstant(m, "MATMUL", K_MATMUL) < 0
            || PyModule_AddIntConstant(m, "IMATMUL", K_IMATMUL) < 0
            || PyModule_AddIntConstant(m, "DOT", K_DOT) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
