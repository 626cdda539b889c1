"""Metrics recorded at logged steps, batched over the ensemble.

:class:`MetricRecorder` is built once per chunk with the initial parameters and
the data; at each logged step the trainer calls :meth:`~MetricRecorder.record`, which
returns the values of both tables as tensors with the ensemble axis first; the
keys are column names of ``storage.schema.TRAJECTORIES`` and ``LAYERS``. A column
a recorder does not return is stored as NULL, and so is a NaN: every metric that
does not apply to a member is NaN, never a made-up number.

Probe set: the first ``metrics.probe_size`` test inputs of each member (all of
them if there are fewer), the same at every step and for every run with the
same data seed. Definitions (per member; norms over the probe inputs and outputs):

trajectories
    ``param_rel_change``  ‖θ(t) − θ(0)‖ / ‖θ(0)‖ (weights and biases).
    ``param_norm``        ‖θ(t)‖.  ``grad_norm``: ‖∇_θ L‖ (full training loss).
    ``output_norm``       RMS of f over the probe set, √(mean_{x,o} f_o(x)²).
    ``kernel_distance``   1 − ⟨K_t, K_0⟩_F / (‖K_t‖_F ‖K_0‖_F) of the empirical NTK
                          (:mod:`pipeline.train.metrics._ntk`; trace kernel over outputs); needs ``metrics.ntk``.
    ``kernel_alignment``  ⟨K_t, YYᵀ⟩_F / (‖K_t‖_F ‖YYᵀ‖_F), Y the probe labels
                          (= ⟨K, yyᵀ⟩ / (‖K‖ ‖y‖²) for one output).
    ``kernel_rel_change`` ‖K_t − K_0‖_F / ‖K_0‖_F: first order in the kernel's movement;
                          needs ``metrics.ntk``. When lazy it is O(m^-1/2) at most, but
                          falls faster at moderate widths m: the smooth part of the
                          change goes like m^-1, the activation flips like m^-1/2.
                          Measured (``sweeps/width_laziness.yaml``, init scale 1, t = 800,
                          3 seeds): m^-0.81 over widths 32-4096 (-0.96 over 32-256,
                          -0.70 over 256-4096; seeds -0.76 ... -0.85).
    ``ntk_eig_min/max``   smallest / largest eigenvalue of K_t (P×P); NaN at logged steps
                          that ``metrics.spectra_budget`` leaves out.
    ``act_flip_frac``     fraction of (probe input, hidden unit) pairs, pooled over all
                          hidden layers, whose pre-activation sign (z > 0 or not) differs
                          from step 0. NaN for linear nets and depth 1 (no activation
                          pattern exists).
    ``dead_frac``         fraction of hidden units (pooled over hidden layers) with
                          z ≤ 0 on every probe input, where such a unit is dead
                          (:attr:`Activation.dead <pipeline.activations.Activation>`:
                          ReLU, and leaky ReLU with slope 0); NaN otherwise (a leaky
                          unit with slope > 0 is never dead).
    ``transversal_grad_sq`` mean over all test inputs of ‖P⊥ ∇ₓ f(x)‖² (summed over
                          outputs), P⊥ the orthogonal projector onto the codimension of
                          subspace data (``codim_basis``); NaN without one or if
                          ``metrics.transversal`` is false.
    ``probe_test_loss``   the loss 1/(2P) Σ ‖f − y‖² on the probe set.
    ``lin_test_loss``     the same loss of the kernel predictor: the linearized model at
                          θ(0) (NTK at init on the training set) trained by gradient flow
                          to the same time t (:class:`pipeline.train.metrics._ntk.KernelFlow`, closed form).
    ``lin_distance``      RMS over the probe set of f(t) − f_lin(t): how far the net is
                          from its linearization (small in the lazy regime). Both need
                          ``metrics.ntk`` and ``metrics.linearized``, one output and at
                          most :data:`LINEARIZED_MAX_TRAIN` training points; else NaN.
    ``even_part_frac``    ‖f_e‖ / √(‖f_e‖² + ‖f_o‖²) on the probe set, with
                          f_e(x) = (f(x) + f(−x))/2 and f_o(x) = (f(x) − f(−x))/2: the even
                          share of f on P ∪ −P (0 for a bias-free linear net). Recorded
                          for symmetric data kinds (``metrics.even_part``), else NaN.

layers (l = 1 … L)
    ``fro_norm``, ``rel_change``  ‖W_l(t)‖_F and ‖W_l(t) − W_l(0)‖_F / ‖W_l(0)‖_F.
    ``top_sv``, ``delta_top_sv``  the ``metrics.top_k`` largest singular values of W_l(t)
                          and of W_l(t) − W_l(0), descending; entries beyond
                          min(fan_out, fan_in) are NULL, and all entries at logged
                          steps that ``metrics.spectra_budget`` leaves out.
    ``stable_rank``       ‖W_l‖_F² / ‖W_l‖_2² (with the spectra).
    ``balance_defect``    activations positively homogeneous of degree k (relu,
                          leaky_relu: k = 1):
                          (c_l(t) − c_l(0)) / (‖W_l(0)‖_F² + ‖W_{l+1}(0)‖_F²),
                          c_l = k‖W_{l+1}‖_F² − ‖W_l‖_F² − ‖b_l‖²; linear nets:
                          ‖D_l(t) − D_l(0)‖_F / (same), D_l = W_{l+1}ᵀW_{l+1} − W_l W_lᵀ − b_l b_lᵀ;
                          NaN for the last layer and for other activations (tanh).

Cost: one probe forward, one backward per output for the NTK (O(E·P²·width) per
layer), one test forward and backward per output for the transversal gradient,
one batched SVD per layer (O(width³) for square layers) and one eigendecomposition
of the kernel (O(P³)) per logged step. The decompositions run in LAPACK far below
the matmul rate (on an accelerator they are fixed sequences of batched matmuls instead:
:mod:`pipeline.train.metrics._squaring`, :mod:`pipeline.train.metrics._subspace`,
:mod:`pipeline.train.metrics._decay`), so ``metrics.spectra_budget`` caps their estimated work
(per method: :func:`pipeline.train.metrics._spectra.svd_work`) at a fraction of the training's by
computing them at a log-spaced subset of the logged steps (NULL at the others);
``metrics.spectra`` turns the SVDs off, ``metrics.ntk`` the kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from phasesweep.pipeline.data._datasets import DataBatch
from phasesweep.pipeline.grid import step_flops
from phasesweep.pipeline.spec import PAIRED_KINDS, MetricsConfig, RunConfig
from phasesweep.pipeline.train._models import EnsembleMLP, Forward, Params, member_sq_norm
from phasesweep.pipeline.train._optim import step_rows
from phasesweep.pipeline.train.metrics._ntk import (
    KernelFlow,
    Scaled,
    empirical_ntk,
    extreme_eigenvalues,
    kernel_alignment,
    kernel_distance,
    kernel_rel_change,
    layer_inner,
    scaled,
    sensitivities,
    target_norm,
)
from phasesweep.pipeline.train.metrics._spectra import (
    balance_matrix_drift,
    balance_scalar,
    eig_work,
    initial_balance_matrices,
    spectra_schedule,
    stable_rank,
    svd_work,
    top_singular_values,
)
from torch import Tensor

#: Most elements (members × rows × width) of one block of test points in the
#: transversal gradient: small blocks avoid fresh page-faulting allocations.
_TEST_BLOCK_ELEMENTS = 1 << 17

#: Most training points for the kernel predictor (one n×n eigendecomposition per member).
LINEARIZED_MAX_TRAIN = 512


def probe_count(cfg: MetricsConfig, n_test: int) -> int:
    """Size of the probe set: the first ``cfg.probe_size`` of ``n_test`` test inputs, all
    of them if there are fewer."""
    return min(cfg.probe_size, n_test)


def _nan(like: Tensor) -> Tensor:
    return torch.full((like.shape[0],), float("nan"), dtype=like.dtype, device=like.device)


# -- function-space metrics ---------------------------------------------------------------


def hidden_signs(fwd: Forward) -> list[Tensor] | None:
    """Sign pattern (z > 0) of every hidden unit on every input: one (E, n, n_l) bool
    tensor per hidden layer (kept apart: concatenating them costs more than the counts)."""
    hidden = fwd.pre[:-1]
    if not hidden:
        return None
    return [z > 0 for z in hidden]


def act_flip_frac(signs: list[Tensor], signs0: list[Tensor]) -> Tensor:
    """Fraction of (input, hidden unit) pairs whose sign pattern differs: (E,)."""
    flips = sum(torch.count_nonzero(s != s0, dim=(1, 2)) for s, s0 in zip(signs, signs0))
    return flips.to(torch.float64) / sum(s[0].numel() for s in signs)


def dead_frac(signs: list[Tensor]) -> Tensor:
    """Fraction of hidden units inactive (z ≤ 0) on every input: (E,). (A unit's largest
    sign as a byte over the inputs: ``any`` along the inputs axis costs about twice as
    much on the CPU.)"""
    dead = sum(torch.count_nonzero(s.view(torch.uint8).amax(1) == 0, dim=1) for s in signs)
    return dead.to(torch.float64) / sum(s.shape[2] for s in signs)


def transversal_grad_sq(net: EnsembleMLP, params: Params, x: Tensor, basis: Tensor) -> Tensor:
    """mean_x Σ_o ‖P⊥ ∇ₓ f_o(x)‖² with P⊥ = V Vᵀ, V = ``basis`` (E, d, c) orthonormal.

    ∇ₓ f_o(x) = c_1 W_1ᵀ δ^o_1(x), so the projection is c_1 δ^o_1 (W_1 V), one bmm.
    The inputs are processed in blocks of rows (bounded memory).
    """
    E, n, _ = x.shape
    w_v = torch.bmm(params.weights[0], basis)  # (E, n_1, c)
    rows = max(1, _TEST_BLOCK_ELEMENTS // (E * max(net.dims)))
    total = x.new_zeros(E)
    for start in range(0, n, rows):
        fwd = net.forward(params, x[:, start : start + rows])
        for deltas in sensitivities(net, params, fwd):
            proj = torch.bmm(deltas[0], w_v).mul_(net.multipliers[0])
            total += proj.square().sum((1, 2))
    return total / n


def even_part_frac(net: EnsembleMLP, params: Params, x: Tensor) -> Tensor:
    """‖f_e‖ / √(‖f_e‖² + ‖f_o‖²) over inputs x (E, P, d), f_e/f_o the even/odd parts."""
    n = x.shape[1]
    out = net(params, torch.cat([x, -x], 1))
    plus, minus = out[:, :n], out[:, n:]
    even = member_sq_norm(plus + minus)
    odd = member_sq_norm(plus - minus)
    return (even / (even + odd)).sqrt()


# -- the recorder ---------------------------------------------------------------------------


class MetricRecorder:
    """Metrics of one chunk relative to its initial parameters ``params0`` (kept, not
    copied: they must not change while the recorder is in use).

    ``data_kind``: the chunk's ``data.kind`` (decides ``even_part_frac`` when
    ``metrics.even_part`` is None). ``logged_steps`` and ``train_flops`` (the
    training's work per member, in flops) let ``metrics.spectra_budget`` choose the
    logged steps that get singular values; without them every call computes them.
    :meth:`for_run` fills all three from a run's config. ``accelerated``: the accelerator's
    paths (eigenvalues, singular values and the kernel predictor by fixed sequences of
    batched matmuls instead of LAPACK, and the spectra budget costed for them). ``clock``
    (E, len(logged_steps)): the trainer's times at the logged steps, where known ahead
    (:meth:`pipeline.train._optim.Schedule.clock`): the accelerated kernel predictor then
    computes blocks of logged steps at once (:class:`pipeline.train.metrics._ntk.KernelFlow`).
    """

    def __init__(
        self,
        net: EnsembleMLP,
        params0: Params,
        batch: DataBatch,
        cfg: MetricsConfig,
        data_kind: str | None = None,
        logged_steps: Sequence[int] | None = None,
        train_flops: float | None = None,
        accelerated: bool = False,
        clock: Tensor | None = None,
    ) -> None:
        self.net, self.batch, self.cfg = net, batch, cfg
        self.accelerated = accelerated
        self.params0 = params0  # read, never written (nor by the trainer): not copied
        self.w0_sq = [member_sq_norm(w) for w in params0.weights]
        # ‖θ(0)‖ as Params.sq_norm sums it (weights, then biases), its weights' terms reused
        self.norm0 = sum(self.w0_sq + [member_sq_norm(b) for b in params0.biases or []]).sqrt()
        self.w0_fro = [s.sqrt() for s in self.w0_sq]
        P = probe_count(cfg, batch.x_test.shape[1])
        self.probe_x = batch.x_test[:, :P]
        self.probe_y = batch.y_test[:, :P]

        even = cfg.even_part
        self.even = data_kind in PAIRED_KINDS if even is None else even
        self.transversal = cfg.transversal and batch.codim_basis is not None

        act = net.act
        self.has_pattern = not act.identity and net.depth > 1
        # (E,) whether each member's units can die; None where none can
        self.dead_ok: Tensor | None = None
        if act.dead is not None:
            dead = torch.as_tensor(act.dead(net.slope), device=batch.x_test.device)
            self.dead_ok = dead.reshape(-1).expand(batch.x_test.shape[0])

        # the references at θ(0), the sign pattern and the kernel, are taken from the
        # first recorded step's forward when that step is 0 (θ_0 = θ(0): one forward and
        # one kernel fewer per chunk), else from θ(0) when first needed (:meth:`_reference`)
        self.signs0: list[Tensor] | None = None
        self.k0: Scaled | None = None
        # ‖YYᵀ‖_F of the probe labels, for the kernel alignment (fixed: computed once)
        self.target_norm = target_norm(self.probe_y) if cfg.ntk else None
        # the NTK's first-layer inner product of the probe inputs: fixed, so computed once
        self.input_gram = None
        if cfg.ntk:
            self.input_gram = layer_inner(net, self.probe_x, 0, params0.biases is not None)
        self.flow: KernelFlow | None = None
        n, k_out = batch.x_train.shape[1], batch.y_train.shape[2]
        if cfg.ntk and cfg.linearized and k_out == 1 and n <= LINEARIZED_MAX_TRAIN:
            x_all = torch.cat([batch.x_train, self.probe_x], 1)
            fwd_all = net.forward(self.params0, x_all)
            k_all = empirical_ntk(net, self.params0, x_all, fwd=fwd_all)
            self.flow = KernelFlow(k_all, fwd_all.output, batch.y_train, accelerated, clock)
        #: the clock's column of each logged step
        self.columns = {int(k): j for j, k in enumerate(sorted(logged_steps or ()))}

        # balance: denominators ‖W_l(0)‖² + ‖W_{l+1}(0)‖² and the initial balance
        self.balance_den = [a + b for a, b in zip(self.w0_sq[:-1], self.w0_sq[1:])]
        self.balance0 = balance_scalar(self.params0, act.degree) if act.degree else None
        self.balance0_matrix = None
        if act.identity and net.depth > 1:
            self.balance0_matrix = initial_balance_matrices(self.params0)

        # the logged steps that get singular values and kernel eigenvalues (None: every
        # call): the same steps while 2 or more fit the budget; below that the singular
        # values at the last logged step only (step 0's ΔW is zero, and the figures read
        # the spectra of t > 0), the kernel's eigenvalues at the first and the last
        self.svd_steps: set[int] | None = None
        self.eig_steps: set[int] | None = None
        per_log = (2 * svd_work(net.dims, accelerated, cfg.top_k) if cfg.spectra else 0.0) + (
            eig_work(P, accelerated) if cfg.ntk else 0.0
        )
        if per_log and cfg.spectra_budget is not None and logged_steps and train_flops:
            steps = sorted(int(k) for k in logged_steps)
            budget = (steps, per_log, train_flops, cfg.spectra_budget)
            self.svd_steps = spectra_schedule(*budget, least=(-1,))
            self.eig_steps = spectra_schedule(*budget)

    @classmethod
    def for_run(
        cls,
        net: EnsembleMLP,
        params0: Params,
        batch: DataBatch,
        config: RunConfig,
        logged_steps: Sequence[int],
        accelerated: bool = False,
        clock: Tensor | None = None,
    ) -> MetricRecorder:
        """The recorder of a chunk whose members share ``config``'s shapes."""
        t = config.train
        per_step = step_flops(net.dims, step_rows(config))
        return cls(
            net,
            params0,
            batch,
            config.metrics,
            data_kind=config.data.kind,
            logged_steps=logged_steps,
            train_flops=per_step * t.steps,
            accelerated=accelerated,
            clock=clock,
        )

    # -- one logged step ------------------------------------------------------------------------
    def record(
        self, params: Params, grads: Params, step: int | None = None, time: Tensor | None = None
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The values of both tables at a logged step: per-member scalars (E,) for
        ``trajectories``; per-layer scalars (E, depth) and lists (E, depth, top_k) for ``layers``.

        ``time`` (E,): the gradient-flow time of the step (for the kernel predictor; without
        it the predictor's columns are left out). ``step``: the logged step; the singular values and the kernel's eigenvalues are NaN
        at steps the budget leaves out; at step 0 ``params`` are θ(0) (as the trainer's
        are), whose probe forward and kernel become the references of the later steps. The weights' norms and their distances from θ(0)
        serve both tables and are computed once.
        """
        w = params.weights
        diffs = [x - x0 for x, x0 in zip(w, self.params0.weights)]
        w_sq = torch.stack([member_sq_norm(x) for x in w], 1)
        d_sq = torch.stack([member_sq_norm(x) for x in diffs], 1)
        norm_sq, diff_sq = w_sq.sum(1), d_sq.sum(1)
        if params.biases is not None:
            for b, b0 in zip(params.biases, self.params0.biases):
                norm_sq = norm_sq + member_sq_norm(b)
                diff_sq = diff_sq + member_sq_norm(b - b0)
        eig = self._scheduled(self.eig_steps, step)
        traj = self._trajectory(params, grads, norm_sq.sqrt(), diff_sq.sqrt(), eig, time, step)
        svd = self._scheduled(self.svd_steps, step)
        return traj, self._layers(params, w_sq.sqrt(), d_sq.sqrt(), diffs, svd)

    def _trajectory(
        self,
        params: Params,
        grads: Params,
        norm: Tensor,
        diff: Tensor,
        spectra: bool,
        time: Tensor | None = None,
        step: int | None = None,
    ) -> dict[str, Tensor]:
        net = self.net
        out: dict[str, Tensor] = {
            "param_rel_change": diff / self.norm0,
            "param_norm": norm,
            "grad_norm": grads.sq_norm().sqrt(),
        }
        fwd = net.forward(params, self.probe_x)
        k = None
        if self.cfg.ntk:
            k = empirical_ntk(net, params, self.probe_x, fwd=fwd, input_gram=self.input_gram)
        if self._reference_missing():
            self._reference(*((fwd, k) if step == 0 else ()))
        f = fwd.output
        out["output_norm"] = f.square().mean((1, 2)).sqrt()
        out["probe_test_loss"] = 0.5 * (f - self.probe_y).square().sum(2).mean(1)
        if self.flow is not None and time is not None:
            f_lin = self.flow.probe_outputs(time.to(f.dtype), self.columns.get(step))
            out["lin_test_loss"] = 0.5 * (f_lin - self.probe_y).square().sum(2).mean(1)
            out["lin_distance"] = (f - f_lin).square().mean((1, 2)).sqrt()

        if k is not None and self.k0 is not None:
            kernel = scaled(k)
            out["kernel_distance"] = kernel_distance(kernel, self.k0)
            out["kernel_rel_change"] = kernel_rel_change(kernel, self.k0)
            out["kernel_alignment"] = kernel_alignment(kernel, self.probe_y, self.target_norm)
            if spectra:
                out["ntk_eig_min"], out["ntk_eig_max"] = extreme_eigenvalues(k, self.accelerated)
            else:
                out["ntk_eig_min"] = out["ntk_eig_max"] = _nan(norm)

        if self.signs0 is not None:
            signs = hidden_signs(fwd)
            out["act_flip_frac"] = act_flip_frac(signs, self.signs0)
            if self.dead_ok is not None:
                out["dead_frac"] = torch.where(self.dead_ok, dead_frac(signs), _nan(norm))

        if self.transversal:
            out["transversal_grad_sq"] = transversal_grad_sq(
                net, params, self.batch.x_test, self.batch.codim_basis
            )
        if self.even:
            out["even_part_frac"] = even_part_frac(net, params, self.probe_x)
        return out

    def _layers(
        self, params: Params, fro: Tensor, delta: Tensor, diffs: list[Tensor], spectra: bool
    ) -> dict[str, Tensor]:
        out = {"fro_norm": fro, "rel_change": delta / torch.stack(self.w0_fro, 1)}
        k = self.cfg.top_k
        if self.cfg.spectra and not spectra:
            nan = torch.full((*fro.shape, k), float("nan"), dtype=fro.dtype, device=fro.device)
            out.update(top_sv=nan, delta_top_sv=nan, stable_rank=nan[..., 0])
        elif self.cfg.spectra:
            finite = torch.isfinite(fro)  # a non-finite entry makes the norm non-finite
            # W_l and W_l − W_l(0) of every member in one batch
            both = torch.stack(
                [
                    top_singular_values(
                        torch.cat([x, d]), k, finite[:, l].repeat(2), self.accelerated
                    )
                    for l, (x, d) in enumerate(zip(params.weights, diffs))
                ],
                1,
            )
            top, out["delta_top_sv"] = both.chunk(2)
            out["top_sv"] = top
            out["stable_rank"] = stable_rank(fro, top[..., 0])

        out["balance_defect"] = self._balance(params, fro)
        return out

    def _reference_missing(self) -> bool:
        """Whether the references at θ(0) (sign pattern, kernel) are still to be taken."""
        return (self.has_pattern and self.signs0 is None) or (self.cfg.ntk and self.k0 is None)

    def _reference(self, fwd0: Forward | None = None, k0: Tensor | None = None) -> None:
        """Take the references at θ(0): from ``fwd0`` and ``k0``, the probe forward and the
        kernel of a step whose parameters are θ(0) (step 0: the trainer starts from a copy
        of θ(0), so they are the same numbers), else computed from θ(0) here."""
        if fwd0 is None:
            fwd0 = self.net.forward(self.params0, self.probe_x)
        if self.has_pattern:
            self.signs0 = hidden_signs(fwd0)
        if self.cfg.ntk:
            if k0 is None:
                k0 = empirical_ntk(
                    self.net, self.params0, self.probe_x, fwd=fwd0, input_gram=self.input_gram
                )
            self.k0 = scaled(k0)

    @staticmethod
    def _scheduled(steps: set[int] | None, step: int | None) -> bool:
        return steps is None or step is None or step in steps

    def _balance(self, params: Params, fro: Tensor) -> Tensor:
        E, L = fro.shape
        defect = torch.full((E, L), float("nan"), dtype=fro.dtype, device=fro.device)
        if L < 2:
            return defect
        act = self.net.act
        if act.identity:
            drift = balance_matrix_drift(params, self.params0, self.balance0_matrix)
        elif act.degree:
            drift = balance_scalar(params, act.degree) - self.balance0
        else:  # not homogeneous: no conserved balance
            return defect
        defect[:, :-1] = drift / torch.stack(self.balance_den, 1)
        return defect
