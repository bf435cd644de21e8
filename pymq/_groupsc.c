/*
 * pymq._groupsc: the one system call pymq/groups.py needs that Python's os module lacks.
 *
 *   die_with_parent(signum)   prctl(PR_SET_PDEATHSIG, signum): the calling process gets signum
 *                             when its parent dies (Linux); True, or OSError.
 *
 * An optional accelerator like the others (see pymq/common/native.py): without it, or with
 * PYMQ_PURE_PYTHON=1, groups.py's twin returns False and a --groups broker is not signalled
 * when its parent dies.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

static PyObject *py_die_with_parent(PyObject *self, PyObject *arg) {
    long signum = PyLong_AsLong(arg);
    if (signum == -1 && PyErr_Occurred()) return NULL;
#ifdef __linux__
    if (prctl(PR_SET_PDEATHSIG, (unsigned long)signum, 0, 0, 0) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_TRUE;
#else
    Py_RETURN_FALSE;
#endif
}

static PyMethodDef methods[] = {
    {"die_with_parent", py_die_with_parent, METH_O,
     "die_with_parent(signum): the calling process gets signum when its parent dies (Linux "
     "prctl PR_SET_PDEATHSIG); True, or False where the system has no such call."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pymq._groupsc",
    "The parent-death signal for pymq.groups' broker processes.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__groupsc(void) { return PyModule_Create(&module); }
