// CallGuard: one C call that says whether a call's arguments are "like" the last call that passed
// every metadata check (cuda_ref.checks.call_guard, cuda_ref.call_checks.CallChecks.check, the op's guard).
//
// CallGuard(n, *args) records its first n arguments as tensor slots and the rest as scalar slots.
// guard(*others) is True only if others has as many arguments and
//   * each tensor slot holds what it held: None where it was None; else a tensor of the same Python
//     type, layout (strided), dtype, device (type and index), rank, sizes and strides (the data,
//     the storage offset and requires_grad are not compared: the checks do not depend on them);
//   * each scalar slot holds None where it held None, or an int / float of the same exact type and
//     value as it held (a float NaN is never equal: the checks refuse it anyway); a slot that held
//     any other object never matches (its value may change under the same identity).
// It keeps no reference to the tensors (their metadata only), a reference to each tensor's type and
// one to each scalar.
// A metadata read that throws (a tensor subclass without strides) answers False.
#include <Python.h>

#include <torch/csrc/autograd/python_variable.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace {

struct Slot {
  bool none = true;
  PyTypeObject *type = nullptr;  // a strong reference (a subclass's type object outlives no guard of it)
  int8_t dtype = 0;
  int8_t device_type = 0;
  int8_t device_index = -1;
  std::vector<int64_t> shape;    // sizes, then strides
};

struct CallGuard {
  PyObject_HEAD
  vectorcallfunc vectorcall;     // guard_vectorcall (calls skip building an argument tuple)
  std::vector<Slot> *tensors;
  PyObject *scalars;             // tuple
};

bool record(PyObject *arg, Slot &slot) {
  if (arg == Py_None) return true;
  if (!THPVariable_Check(arg)) {
    PyErr_Format(PyExc_TypeError, "CallGuard: a tensor slot holds %s (a tensor or None)", Py_TYPE(arg)->tp_name);
    return false;
  }
  const at::TensorBase &t = THPVariable_Unpack(arg);
  if (t.layout() != c10::kStrided) {
    PyErr_SetString(PyExc_TypeError, "CallGuard: a tensor slot holds a tensor that is not strided");
    return false;
  }
  slot.none = false;
  slot.type = Py_TYPE(arg);
  Py_INCREF(slot.type);
  slot.dtype = static_cast<int8_t>(t.scalar_type());
  slot.device_type = static_cast<int8_t>(t.device().type());
  slot.device_index = t.device().index();
  const int64_t d = t.dim();
  slot.shape.resize(2 * d);
  for (int64_t i = 0; i < d; i++) {
    slot.shape[i] = t.sizes()[i];
    slot.shape[d + i] = t.strides()[i];
  }
  return true;
}

bool same_tensor(PyObject *arg, const Slot &slot) {
  if (slot.none) return arg == Py_None;
  if (Py_TYPE(arg) != slot.type || !THPVariable_Check(arg)) return false;
  const at::TensorBase &t = THPVariable_Unpack(arg);
  if (t.layout() != c10::kStrided || static_cast<int8_t>(t.scalar_type()) != slot.dtype ||
      static_cast<int8_t>(t.device().type()) != slot.device_type || t.device().index() != slot.device_index)
    return false;
  const int64_t d = t.dim();
  if (2 * d != static_cast<int64_t>(slot.shape.size())) return false;
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  for (int64_t i = 0; i < d; i++)
    if (sizes[i] != slot.shape[i] || strides[i] != slot.shape[d + i]) return false;
  return true;
}

// 1: the same scalar, 0: not, -1: an error (comparing exact ints does not raise; kept for form)
int same_scalar(PyObject *arg, PyObject *kept) {
  if (kept == Py_None) return arg == Py_None;
  if (PyFloat_CheckExact(kept)) return PyFloat_CheckExact(arg) && PyFloat_AS_DOUBLE(arg) == PyFloat_AS_DOUBLE(kept);
  if (PyLong_CheckExact(kept)) return PyLong_CheckExact(arg) && (arg == kept || PyObject_RichCompareBool(arg, kept, Py_EQ));
  return 0;   // another type: its value may change under the same identity
}

PyObject *guard_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames);

PyObject *guard_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  if (kwargs && PyDict_GET_SIZE(kwargs)) {
    PyErr_SetString(PyExc_TypeError, "CallGuard: positional arguments only");
    return nullptr;
  }
  const Py_ssize_t nargs = PyTuple_GET_SIZE(args);
  if (nargs < 1 || !PyLong_Check(PyTuple_GET_ITEM(args, 0))) {
    PyErr_SetString(PyExc_TypeError, "CallGuard(n, *args): n, the number of tensor slots, first");
    return nullptr;
  }
  const Py_ssize_t n = PyLong_AsSsize_t(PyTuple_GET_ITEM(args, 0));
  if (n < 0 || n > nargs - 1) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "CallGuard: n must be in [0, len(args)]");
    return nullptr;
  }
  auto *self = reinterpret_cast<CallGuard *>(type->tp_alloc(type, 0));
  if (!self) return nullptr;
  self->vectorcall = guard_vectorcall;
  self->tensors = nullptr;
  self->scalars = nullptr;
  try {
    self->tensors = new std::vector<Slot>(n);
    for (Py_ssize_t i = 0; i < n; i++)
      if (!record(PyTuple_GET_ITEM(args, 1 + i), (*self->tensors)[i])) {
        Py_DECREF(self);
        return nullptr;
      }
  } catch (const std::exception &e) {
    PyErr_SetString(PyExc_TypeError, e.what());
    Py_DECREF(self);
    return nullptr;
  }
  self->scalars = PyTuple_GetSlice(args, 1 + n, nargs);
  if (!self->scalars) {
    Py_DECREF(self);
    return nullptr;
  }
  return reinterpret_cast<PyObject *>(self);
}

void guard_dealloc(CallGuard *self) {
  if (self->tensors)
    for (Slot &slot : *self->tensors) Py_XDECREF(slot.type);
  delete self->tensors;
  Py_XDECREF(self->scalars);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject *>(self));
}

PyObject *guard_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
  auto *self = reinterpret_cast<CallGuard *>(callable);
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  const Py_ssize_t n = static_cast<Py_ssize_t>(self->tensors->size());
  if ((kwnames && PyTuple_GET_SIZE(kwnames)) || nargs != n + PyTuple_GET_SIZE(self->scalars)) Py_RETURN_FALSE;
  try {
    for (Py_ssize_t i = 0; i < n; i++)
      if (!same_tensor(args[i], (*self->tensors)[i])) Py_RETURN_FALSE;
  } catch (const std::exception &) {   // metadata that cannot be read: not like the last call
    Py_RETURN_FALSE;
  }
  for (Py_ssize_t i = n; i < nargs; i++) {
    const int r = same_scalar(args[i], PyTuple_GET_ITEM(self->scalars, i - n));
    if (r < 0) return nullptr;
    if (!r) Py_RETURN_FALSE;
  }
  Py_RETURN_TRUE;
}

PyTypeObject CallGuardType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_splitkv_guard",
                          "CallGuard: a call's tensors' metadata and scalars against the last call that passed.",
                          -1, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__splitkv_guard(void) {
  CallGuardType.tp_name = "_splitkv_guard.CallGuard";
  CallGuardType.tp_basicsize = sizeof(CallGuard);
  CallGuardType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  CallGuardType.tp_new = guard_new;
  CallGuardType.tp_dealloc = reinterpret_cast<destructor>(guard_dealloc);
  CallGuardType.tp_call = PyVectorcall_Call;
  CallGuardType.tp_vectorcall_offset = offsetof(CallGuard, vectorcall);
  CallGuardType.tp_doc = "CallGuard(n, *args): see the module's source";
  if (PyType_Ready(&CallGuardType) < 0) return nullptr;
  PyObject *m = PyModule_Create(&module_def);
  if (!m) return nullptr;
  Py_INCREF(&CallGuardType);
  if (PyModule_AddObject(m, "CallGuard", reinterpret_cast<PyObject *>(&CallGuardType)) < 0) {
    Py_DECREF(&CallGuardType);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
