"""What upstream's ``common_utils.TestCase`` adds to ``unittest.TestCase``.

:class:`CaseParityMixin` (a base of :class:`disttest.TestCase`) carries
upstream's extra assertions (``assertEqualIgnoreType``, ``assertNotWarn``,
``assertWarnsOnceRegex``...; ``assertExpected`` and friends from
:mod:`disttest.runners.case_expect`), its comparison
helpers (``compare_with_numpy``), its subprocess helpers, the policy
wrappers (``wrap_with_policy``, the CUDA ones) and, from
:mod:`disttest.runners.case_sparse`, its sparse-tensor generators, with
upstream's semantics and messages, on torch's public API.

Everything runs in the process or thread that calls it (in a rank, in that
rank). The CUDA helpers skip the test, with a reason, on a host without
CUDA; the CUDA policies of ``__init__`` then wrap nothing, as upstream's.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import re
import subprocess
import sys
import tempfile
import types
import unittest
import unittest.mock
import warnings
from collections.abc import Callable, Iterable, Iterator
from functools import wraps
from typing import TYPE_CHECKING, Any

import expecttest
import numpy as np
import torch

from disttest import _compat
from disttest.runners.case_expect import ExpectedOutputMixin
from disttest.runners.case_guards import (
    NEEDS_CUDA,
    CudaMemoryLeakCheck,
    CudaNonDefaultStream,
    DeterministicGuard,
    _has_cuda,
    _warn_always,
)
from disttest.runners.case_sparse import SparseTensorsMixin

__unittest = True

__all__ = ["CaseParityMixin"]

_NO_DEVICE_TYPE = object()

#: Upstream's messages, word for word.
FUNCTION_MODES_LEAKED = "torch function mode stack was leaked: length changed from {before} to {after}"
FUNCTION_STATE_LEAKED = "torch function state was leaked: changed from {before} to {after}"
#: ``{flags}``: a line ``  torch.backends.cuda.matmul.fp32_precision: was 'none', became 'tf32'`` per flag.
FP32_PRECISION_LEAKED = "fp32 precision flag leak detected:\n{flags}"
NO_WARNING_CAUGHT = "no warning caught"
OBJECT_NOT_FOUND = "object not found in iterable"
_IS_WINDOWS = sys.platform == "win32"
#: The first torch whose ``TestCase`` fails a test that leaves an fp32
#: precision setting changed, and resets dynamo around every test.
CHECKS_FROM = "2.14"


class _RaisesSkippingNotImplemented(unittest.case._AssertRaisesContext):  # type: ignore[type-arg]
    """assertRaises's context, but a NotImplementedError skips the test."""

    def __exit__(self, exc_type: Any, exc_value: Any, tb: Any) -> bool:
        if exc_type is not None and issubclass(exc_type, NotImplementedError):
            self.test_case.skipTest(f"not_implemented: {exc_value}")
        return bool(super().__exit__(exc_type, exc_value, tb))


@contextlib.contextmanager
def _skip_not_implemented() -> Iterator[None]:
    try:
        yield
    except NotImplementedError as e:
        raise unittest.SkipTest(f"not implemented: {e}") from e


if TYPE_CHECKING:
    _Base = expecttest.TestCase
else:
    _Base = object


class CaseParityMixin(SparseTensorsMixin, ExpectedOutputMixin, _Base):
    """Upstream ``common_utils.TestCase``'s additions to ``unittest.TestCase``
    (a mixin of :class:`disttest.TestCase`, which holds ``assertEqual``).

    Class attributes, as upstream: ``_ignore_not_implemented_error`` (a
    ``NotImplementedError`` in the test, or in ``assertRaises``, skips it),
    ``_do_cuda_non_default_stream`` (CUDA tests run on a non-default stream),
    ``_do_cuda_memory_leak_check`` (with ``PYTORCH_TEST_CUDA_MEM_LEAK_CHECK=1``,
    CUDA tests fail on leaked memory), ``_default_dtype_check_enabled``
    (``setUp`` and ``tearDown`` insist on a float32 default dtype).
    """

    _precision: float = 0
    _rel_tol: float = 0
    _default_dtype_check_enabled: bool = False
    _do_cuda_memory_leak_check: bool = False
    _do_cuda_non_default_stream: bool = False
    _ignore_not_implemented_error: bool = False
    #: What ``setUp`` saw (``tearDown`` puts it back); as upstream, the
    #: defaults serve a subclass whose ``setUp`` did not call this one's
    #: (None: the state ``__torch_function__`` enabled, read when needed).
    _prev_torch_function_mode_stack_len: int = 0
    _prev_torch_function_state: Any = None
    # Always a full diff of multi-line strings.
    _diffThreshold = sys.maxsize
    maxDiff = None

    def __init__(self, method_name: str = "runTest", methodName: str = "runTest") -> None:
        if methodName != "runTest":
            method_name = methodName
        super().__init__(method_name)
        test_method = getattr(self, method_name, None)
        if test_method is None:
            return
        if os.environ.get("PYTORCH_TEST_CUDA_MEM_LEAK_CHECK") == "1":
            self._do_cuda_memory_leak_check &= getattr(test_method, "_do_cuda_memory_leak_check", True)
            if self._do_cuda_memory_leak_check and not _IS_WINDOWS:
                self.wrap_with_cuda_policy(method_name, self.assertLeaksNoCudaTensors)
        self._do_cuda_non_default_stream &= getattr(test_method, "_do_cuda_non_default_stream", True)
        if self._do_cuda_non_default_stream and not _IS_WINDOWS:
            self.wrap_with_cuda_policy(method_name, self.enforceNonDefaultStream)
        if self._ignore_not_implemented_error:
            self.wrap_with_policy(method_name, _skip_not_implemented)

    def run(self, result: Any = None) -> Any:
        # As upstream's run: a compiler stance a test set (set_stance) ends
        # with it, and so does a suppress_errors it set; from torch 2.14 on,
        # dynamo's caches are cleared before and after the test as well.
        with _compat.dynamo_test_state(reset=_compat.torch_at_least(CHECKS_FROM)):
            return super().run(result)

    def _should_stop_test_suite(self) -> bool:
        """Whether the suite cannot go on after this test, as upstream's
        asks: CUDA was used and ``torch.cuda.synchronize()`` fails (a
        device-side error poisons every later test). Its message is a
        warning. The process runner's parent answers False, as upstream's."""
        if not torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            return False
        try:
            torch.cuda.synchronize()
        except RuntimeError as e:
            warnings.warn(f"TEST SUITE EARLY TERMINATION due to torch.cuda.synchronize() failure: {e}",
                          stacklevel=2)
            return True
        return False

    def setUp(self) -> None:
        super().setUp()
        # Sparse tensors are checked as built, as upstream; tearDown restores the setting.
        invariants = torch.sparse.check_sparse_tensor_invariants
        self._check_invariants = invariants.is_enabled()  # type: ignore[no-untyped-call]
        invariants.enable()  # type: ignore[no-untyped-call]
        self._check_default_dtype()
        self._prev_grad_state = torch.is_grad_enabled()
        self._prev_torch_function_mode_stack_len = _compat.function_mode_depth()
        self._prev_torch_function_state = _compat.function_state()
        if _compat.torch_at_least(CHECKS_FROM) and os.environ.get("PYTORCH_DISABLE_FP32_PRECISION_LEAK_CHECK") != "1":
            self._disttest_fp32_precision = _compat.fp32_precision()  # (not upstream's name: its tuple)

    def tearDown(self) -> None:
        """Hook method for the end of a test: put back what upstream's puts
        back (sparse invariant checks, grad mode, torch function modes and
        state; from torch 2.14 on the fp32 precision settings), then fail on
        what upstream fails on (a default dtype other than float; function
        modes a test left pushed, which ``set_default_device`` does; a
        changed torch function state; from torch 2.14 on a changed fp32
        precision setting, unless ``PYTORCH_DISABLE_FP32_PRECISION_LEAK_CHECK=1``).
        Unlike upstream's, everything is put back before the first failure."""
        if hasattr(self, "_check_invariants"):
            invariants = torch.sparse.check_sparse_tensor_invariants
            if self._check_invariants:
                invariants.enable()  # type: ignore[no-untyped-call]
            else:
                invariants.disable()  # type: ignore[no-untyped-call]
        if hasattr(self, "_prev_grad_state"):
            torch.set_grad_enabled(self._prev_grad_state)
        leaks = self._undo_function_leaks() + self._undo_precision_leaks()
        self._check_default_dtype()
        if leaks:
            raise AssertionError(leaks[0])
        super().tearDown()

    def _undo_function_leaks(self) -> list[str]:
        """Pop the function modes the test left pushed and restore the torch
        function state; the messages of what was leaked (upstream's words)."""
        # NB: as upstream's, against the class's defaults (none pushed, the
        # state enabled) where a subclass's setUp did not call this one's.
        leaks = []
        before = self._prev_torch_function_mode_stack_len
        after = _compat.function_mode_depth()
        if after > before:
            _compat.drop_function_modes(after - before)
        if after != before:
            leaks.append(FUNCTION_MODES_LEAKED.format(before=before, after=after))
        state = self._prev_torch_function_state
        if state is None:
            state = _compat.function_state_enabled()
        now = _compat.function_state()
        if state is not None and now != state:
            _compat.restore_function_state(state)
            leaks.append(FUNCTION_STATE_LEAKED.format(before=state, after=now))
        return leaks

    def _undo_precision_leaks(self) -> list[str]:
        """Put back the fp32 precision settings ``setUp`` saw (torch 2.14 on,
        as upstream's: none where a subclass's setUp did not call this one's);
        the message of what was changed (upstream's words)."""
        before = getattr(self, "_disttest_fp32_precision", None)
        if before is None:
            return []
        now = _compat.fp32_precision()
        changed = {name: value for name, value in before.items() if now.get(name) != value}
        if not changed:
            return []
        _compat.set_fp32_precision(changed)
        lines = [f"  {name}: was {value!r}, became {now.get(name)!r}" for name, value in changed.items()]
        return [FP32_PRECISION_LEAKED.format(flags="\n".join(lines))]

    def _formatMessage(self, msg: Any, standardMsg: str) -> str:
        # As upstream's from torch 2.14 on: a callable ``msg`` makes the
        # message from the standard one when the assertion fails (before,
        # unittest's: its repr follows the standard message).
        if callable(msg) and _compat.torch_at_least(CHECKS_FROM):
            return str(msg(standardMsg))
        return str(super()._formatMessage(msg, standardMsg))

    def _check_default_dtype(self) -> None:
        if self._default_dtype_check_enabled and torch.get_default_dtype() != torch.float:
            raise AssertionError(f"expected default dtype to be torch.float, got {torch.get_default_dtype()}")

    @property
    def precision(self) -> float:
        """The least absolute tolerance upstream's ``assertEqual`` uses
        (``@precisionOverride`` sets it); stored here, see the reference page."""
        return self._precision

    @precision.setter
    def precision(self, prec: float) -> None:
        self._precision = prec

    @property
    def rel_tol(self) -> float:
        """The least relative tolerance (``@toleranceOverride`` sets it)."""
        return self._rel_tol

    @rel_tol.setter
    def rel_tol(self, prec: float) -> None:
        self._rel_tol = prec

    # --- policies: context managers around a test method -------------------

    def assertLeaksNoCudaTensors(self, name: str | None = None) -> CudaMemoryLeakCheck:
        """A :class:`CudaMemoryLeakCheck` named ``name`` (default: the test's
        id); skips the test on a host without CUDA (:data:`NEEDS_CUDA`)."""
        if not _has_cuda():
            raise unittest.SkipTest(NEEDS_CUDA.format(helper="assertLeaksNoCudaTensors"))
        return CudaMemoryLeakCheck(self, self.id() if name is None else name)

    def before_cuda_memory_leak_check(self) -> None:
        """Hook method for clearing caches before the leak check counts
        (default: reset dynamo, when it is loaded)."""
        _compat.reset_dynamo()

    @staticmethod
    def _reset_dynamo_if_imported() -> None:
        """``torch._dynamo.reset()`` where dynamo is loaded (upstream's helper, torch 2.14 on)."""
        _compat.reset_dynamo()

    def enforceNonDefaultStream(self) -> CudaNonDefaultStream:
        """A :class:`CudaNonDefaultStream`; skips the test on a host without
        CUDA (:data:`NEEDS_CUDA`)."""
        if not _has_cuda():
            raise unittest.SkipTest(NEEDS_CUDA.format(helper="enforceNonDefaultStream"))
        return CudaNonDefaultStream()

    def wrap_with_cuda_policy(self, method_name: str, policy: Callable[[], Any]) -> None:
        """:meth:`wrap_with_policy`, only on a host with CUDA and only for a
        test whose id says ``cuda`` or ``gpu``; otherwise nothing."""
        fullname = self.id().lower()
        if ("gpu" in fullname or "cuda" in fullname) and _has_cuda():
            setattr(self, method_name, self.wrap_method_with_policy(getattr(self, method_name), policy))

    def wrap_with_policy(self, method_name: str, policy: Callable[[], Any]) -> None:
        """Make this instance's ``method_name`` run inside ``policy()``."""
        setattr(self, method_name, self.wrap_method_with_policy(getattr(self, method_name), policy))

    def wrap_method_with_policy(self, method: Callable[..., Any], policy: Callable[[], Any]) -> Callable[..., Any]:
        """``method`` (bound to this test) run inside ``policy()``, a
        zero-argument function that returns a context manager, made anew per call."""
        @wraps(method)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
            with policy():
                method(*args, **kwargs)

        return types.MethodType(wrapper, self)

    def wrap_with_cuda_memory_check(self, method: Callable[..., Any]) -> Callable[..., Any]:
        """``method`` under :meth:`assertLeaksNoCudaTensors`."""
        return self.wrap_method_with_policy(method, self.assertLeaksNoCudaTensors)

    def _dynamo_test_key(self) -> str:
        return f"{self.__class__.__name__}.{self._testMethodName}"

    def compile_fn(self, fn: Callable[..., Any], backend: Any, nopython: bool) -> Callable[..., Any]:
        """Hook method for compiling ``fn``: ``torch.compile(fn, backend=backend,
        fullgraph=nopython)``."""
        return torch.compile(fn, backend=backend, fullgraph=nopython)

    # --- assertions ------------------------------------------------------------

    def assertEqualIgnoreType(self, *args: Any, **kwargs: Any) -> None:
        """``assertEqual(..., exact_dtype=False)``."""
        _equal(self)(*args, exact_dtype=False, **kwargs)

    def assertEqualBroadcasting(self, x: Any, y: Any, *args: Any, **kwargs: Any) -> None:
        """``assertEqual(x, y)``, ``y`` broadcast to ``x``'s shape first."""
        if not isinstance(y, Iterable):
            y = torch.ones_like(x) * y
        if not isinstance(y, torch.Tensor):
            y = torch.ones_like(x) * torch.tensor(y)
        _equal(self)(x, y, *args, **kwargs)

    def assertEqualTypeString(self, x: Any, y: Any) -> None:
        """Fail unless ``x`` and ``y`` have the same device, dtype and sparsity."""
        self.assertEqual(x.device, y.device)
        self.assertEqual(x.dtype, y.dtype)
        self.assertEqual(x.is_sparse, y.is_sparse)

    def assertObjectIn(self, obj: Any, iterable: Iterable[Any]) -> None:
        """Fail unless ``obj`` itself (by identity) is in ``iterable``."""
        for elem in iterable:
            if id(obj) == id(elem):
                return
        raise AssertionError(OBJECT_NOT_FOUND)

    def assertRaises(self, expected_exception: Any, *args: Any, **kwargs: Any) -> Any:
        """unittest's; with ``_ignore_not_implemented_error``, a
        ``NotImplementedError`` skips the test instead."""
        if self._ignore_not_implemented_error:
            context = _RaisesSkippingNotImplemented(expected_exception, self)
            try:
                return context.handle("assertRaises", list(args), kwargs)
            finally:
                del context  # https://bugs.python.org/issue23890
        return super().assertRaises(expected_exception, *args, **kwargs)

    def assertRaisesRegex(self, expected_exception: Any, expected_regex: Any,
                          *args: Any, **kwargs: Any) -> Any:
        """unittest's; any message matches when the test is instantiated for
        a device type torch does not have natively (``self.device_type``),
        and with ``_ignore_not_implemented_error`` a ``NotImplementedError``
        skips the test."""
        device_type = getattr(self, "device_type", _NO_DEVICE_TYPE)  # NB: None counts, as upstream's hasattr
        native = ("cpu", "cuda", "xpu", "meta", "mps", "mtia")
        if (device_type is not _NO_DEVICE_TYPE and device_type not in native
                and device_type != _compat.privateuse1_backend_name()):
            expected_regex = ""
        if self._ignore_not_implemented_error:
            context = _RaisesSkippingNotImplemented(expected_exception, self, expected_regex)
            return context.handle("assertRaisesRegex", list(args), kwargs)
        return super().assertRaisesRegex(expected_exception, expected_regex, *args, **kwargs)

    def assertLogs(self, logger: Any = None, level: Any = None) -> Any:
        """unittest's, on the ``torch`` logger unless one is named."""
        return super().assertLogs(logging.getLogger("torch") if logger is None else logger, level)

    def assertNoLogs(self, logger: Any = None, level: Any = None) -> Any:
        """unittest's, on the ``torch`` logger unless one is named."""
        return super().assertNoLogs(logging.getLogger("torch") if logger is None else logger, level)

    def assertNoUnraisable(self, callable: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Fail if ``callable(*args, **kwargs)`` raises an unraisable
        exception (one ``sys.unraisablehook`` sees, as from ``__del__``);
        the garbage collector is off meanwhile."""
        raised = None

        def record_unraisable(unraisable: Any) -> None:
            nonlocal raised
            raised = unraisable

        prev = gc.isenabled()
        gc.disable()
        try:
            with unittest.mock.patch("sys.unraisablehook", record_unraisable):
                callable(*args, **kwargs)
        finally:
            if prev:
                gc.enable()
        self.assertIsNone(raised)

    def assertNotWarn(self, callable: Callable[[], Any], msg: str = "") -> None:
        """Fail (with ``msg``) if ``callable()`` warns; torch's warn-once
        warnings count each time."""
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            with _warn_always(True):
                callable()
            self.assertTrue(len(ws) == 0, msg)

    @contextlib.contextmanager
    def assertWarnsOnceRegex(self, category: type[Warning], regex: str = "") -> Iterator[None]:
        """Context manager: fail unless the block warns a ``category``
        (exactly that type) and some warning's text starts with a match of
        ``regex``; torch's warn-once warnings count each time."""
        pattern = re.compile(regex)
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            with _warn_always(True):
                yield
            if len(ws) == 0:
                self.fail(NO_WARNING_CAUGHT)
            self.assertTrue(any(type(w.message) is category for w in ws))
            self.assertTrue(any(re.match(pattern, str(w.message)) for w in ws),
                            f"{pattern}, {[w.message for w in ws if type(w.message) is category]}")

    def assertAtenOp(self, onnx_model: Any, operator: str, overload_name: str = "") -> None:
        """Fail unless the ONNX graph has an ``ATen`` node (domain
        ``org.pytorch.aten``) for ``operator`` with ``overload_name``."""
        all_aten_nodes = [p for p in onnx_model.graph.node if p.op_type == "ATen" and p.domain == "org.pytorch.aten"]
        self.assertTrue(all_aten_nodes)
        attrs: dict[str, str] = {}
        for op in all_aten_nodes:
            attrs = {attr.name: attr.s.decode() for attr in op.attribute}
            if attrs.get("operator") == operator:
                break
        self.assertEqual(attrs["operator"], operator)
        self.assertEqual(attrs.get("overload_name", ""), overload_name)

    def check_nondeterministic_alert(self, fn: Callable[[], Any], caller_name: str, should_alert: bool = True) -> None:
        """Under ``torch.use_deterministic_algorithms(True)``, check that
        ``fn()`` raises (and with ``warn_only``, warns) that ``caller_name``
        has no deterministic implementation, or with ``should_alert=False``
        that it does not."""
        alert_message = caller_name + " does not have a deterministic implementation, but you set"
        with DeterministicGuard(True):
            if should_alert:
                with self.assertRaisesRegex(RuntimeError, alert_message,
                                            msg="expected a non-deterministic error, but it was not raised"):
                    fn()
            else:
                try:
                    fn()
                except RuntimeError as e:
                    if "does not have a deterministic implementation" in str(e):
                        self.fail('did not expect non-deterministic error message, but got one anyway: "'
                                  + str(e) + '"')
                    raise
        with DeterministicGuard(True, warn_only=True):
            if should_alert:
                with self.assertWarnsRegex(UserWarning, alert_message):
                    fn()
            else:
                with warnings.catch_warnings(record=True) as w:
                    warnings.simplefilter("always")
                    fn()
                    for warning in w:
                        if isinstance(warning, UserWarning):
                            self.assertTrue(re.search(alert_message, str(warning)) is None)

    # --- comparisons with references -----------------------------------------

    def compare_with_reference(self, torch_fn: Callable[..., Any], ref_fn: Callable[..., Any], sample_input: Any,
                               **kwargs: Any) -> None:
        """``assertEqual(torch_fn(sample), ref_fn(sample.numpy()))`` for an
        OpInfo ``SampleInput`` (values only; ``kwargs`` go to ``assertEqual``)."""
        numpy_sample = sample_input.numpy()
        actual = torch_fn(sample_input.input, *sample_input.args, **sample_input.kwargs)
        expected = ref_fn(numpy_sample.input, *numpy_sample.args, **numpy_sample.kwargs)
        _equal(self)(actual, expected, exact_device=False, **kwargs)

    def compare_with_numpy(self, torch_fn: Callable[[Any], Any], np_fn: Callable[[Any], Any], tensor_like: Any,
                           device: Any = None, dtype: torch.dtype | None = None, **kwargs: Any) -> None:
        """``assertEqual(np_fn(a), torch_fn(t))`` for ``tensor_like`` as an
        array ``a`` and a tensor ``t`` (bfloat16 goes to numpy as float32);
        ``device`` and ``dtype`` apply to a non-tensor only."""
        if isinstance(tensor_like, torch.Tensor):
            if device is not None:
                raise AssertionError("device must be None when tensor_like is a Tensor")
            if dtype is not None:
                raise AssertionError("dtype must be None when tensor_like is a Tensor")
            t_cpu = tensor_like.detach().cpu()
            if t_cpu.dtype is torch.bfloat16:
                t_cpu = t_cpu.float()
            a = t_cpu.numpy()
            t = tensor_like
        else:
            a = np.array(tensor_like, dtype=_numpy_dtype(dtype))
            t = torch.tensor(tensor_like, device=device, dtype=dtype)
        np_result = np_fn(a)
        torch_result = torch_fn(t).cpu()
        if isinstance(np_result, np.ndarray):
            try:
                np_result = torch.from_numpy(np_result)
            except Exception:  # noqa: BLE001 (negative strides: copy first)
                np_result = torch.from_numpy(np_result.copy())
            if t.dtype is torch.bfloat16 and torch_result.dtype is torch.bfloat16 and np_result.dtype is torch.float:
                torch_result = torch_result.to(torch.float)
        _equal(self)(np_result, torch_result, **kwargs)

    # --- subprocesses ----------------------------------------------------------

    @staticmethod
    def run_process_no_exception(code: str, env: dict[str, str] | None = None) -> tuple[bytes, bytes]:
        """Run ``python -c code`` (with ``env``); return its (stdout, stderr) bytes."""
        with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=env) as p:
            return p.communicate()

    @staticmethod
    def runWithPytorchAPIUsageStderr(code: str) -> str:
        """Run ``python -c code`` with ``PYTORCH_API_USAGE_STDERR=1`` (and
        without ``CI`` and ``TEST_SHOWLOCALS``); return its stderr."""
        env = os.environ.copy()
        env["PYTORCH_API_USAGE_STDERR"] = "1"
        env.pop("CI", None)
        env.pop("TEST_SHOWLOCALS", None)
        _stdout, stderr = CaseParityMixin.run_process_no_exception(code, env=env)
        return stderr.decode("ascii")

    def _attempt_load_from_subprocess(self, file: Any, import_string: str,
                                      expected_failure_message: str | None = None) -> None:
        """``torch.load(file, weights_only=True)`` in a fresh interpreter
        after ``import_string``: passes when it loads, or with
        ``expected_failure_message``, when it fails with that text (its
        output is then raised as ``RuntimeError``)."""
        script = f"import torch;{import_string}torch.load(r'{file}', weights_only=True)"
        cm: Any = (self.assertRaisesRegex(RuntimeError, re.escape(expected_failure_message))
                   if expected_failure_message else contextlib.nullcontext())
        with cm:
            try:
                # NB: from an empty directory: nothing there can shadow an import
                # (upstream's runs in torch's own testing folder; disttest's
                # has modules named main, case, modes)
                with tempfile.TemporaryDirectory(prefix="disttest-load-") as cwd:
                    subprocess.check_output([sys.executable, "-c", script], stderr=subprocess.STDOUT, cwd=cwd)
            except subprocess.CalledProcessError as e:
                raise RuntimeError(e.output.decode("utf-8")) from None


def _equal(case: Any) -> Any:
    """``case.assertEqual``, which takes :func:`disttest.assert_equal`'s
    keyword options (``disttest.TestCase`` defines it)."""
    return case.assertEqual


def _numpy_dtype(dtype: torch.dtype | None) -> Any:
    """The numpy dtype for ``dtype`` (float32 for bfloat16, complex64 for
    complex32, numpy's default for None)."""
    if dtype is None:
        return None
    if dtype is torch.bfloat16:
        return np.float32
    if dtype is torch.complex32:
        return np.complex64
    return torch.empty(0, dtype=dtype).numpy().dtype
