"""Fully connected nets as vectorized ensembles, with a hand-written backward pass.

Every tensor carries a leading ensemble axis ``E``: weights of layer ``l`` are
``(E, fan_out, fan_in)``, biases ``(E, fan_out)``, inputs ``(E, n, d)``. One
batched matmul advances all members, and members never mix (bmm is
block-diagonal over ``E``), so a member that blows up cannot affect the others.

Layer ``l`` (1-based) computes ``z_l = c_l · h_{l-1} W_lᵀ + b_l`` and
``h_l = φ(z_l)`` (no φ on the last layer). The forward multipliers ``c_l``
and the init std per parameterization, for fan-in ``n_{l-1}``:

=============  ========================  ===========================
name           init std of W_l entries   c_l
=============  ========================  ===========================
standard       g / √n_{l-1}              1
ntk            g                         1/√n_{l-1}
mean_field     g                         1/√n_{l-1}, last layer 1/n_{L-1}
=============  ========================  ===========================

with ``g = init_scale`` (per member). Biases start at zero, so a small init is a
small neighbourhood of the saddle at the origin.

The backward pass is written out (see :func:`loss_and_grads`) rather than
taken from autograd: it avoids building a graph every step and is checked
against autograd in the tests.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from phasesweep.pipeline import activations
from phasesweep.pipeline.spec import ModelConfig
from torch import Tensor


@dataclass
class Params:
    """Parameters of an ensemble. ``weights[l-1]``: (E, n_l, n_{l-1}); ``biases`` likewise (E, n_l)."""

    weights: list[Tensor]
    biases: list[Tensor] | None

    def tensors(self) -> list[Tensor]:
        return self.weights + (self.biases or [])

    def clone(self) -> Params:
        return Params(
            [w.clone() for w in self.weights],
            None if self.biases is None else [b.clone() for b in self.biases],
        )

    def sq_norm(self) -> Tensor:
        """‖θ‖² per member, shape (E,)."""
        return sum(member_sq_norm(t) for t in self.tensors())


def member_sq_norm(t: Tensor) -> Tensor:
    """‖t_e‖² per member of an (E, ...) tensor: (E,). One pass (no squared temporary)."""
    return torch.linalg.vector_norm(t.reshape(t.shape[0], -1), dim=1).square()


def equal_blocks(n: int, most: int) -> list[tuple[int, int]]:
    """``[start, end)`` bounds of the fewest blocks of at most ``most`` of n members, of
    equal sizes (±1): n = 13, most = 6 gives blocks of 5, 4, 4, not 6, 6, 1."""
    count = -(-n // most)
    cuts = [(i * n) // count for i in range(count + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


@dataclass
class Forward:
    """Cached forward pass: ``pre[l-1]`` = z_l (E, n, n_l); ``post[l]`` = h_l, post[0] = x."""

    pre: list[Tensor]
    post: list[Tensor]

    @property
    def output(self) -> Tensor:
        return self.pre[-1]


class EnsembleMLP:
    """The architecture shared by every member of a chunk (shapes and code paths).

    ``leaky_slope`` may differ per member: a tensor of shape (E,) or a float. ``act`` is
    the activation's record, ``slope`` its parameter (:data:`activations.Slope`).
    """

    def __init__(
        self,
        config: ModelConfig,
        input_dim: int,
        output_dim: int,
        leaky_slope: Tensor | float | None = None,
    ) -> None:
        self.config = config
        self.depth = config.depth
        self.dims = [input_dim] + [config.width] * (config.depth - 1) + [output_dim]
        self.act = activations.get(config.activation)
        slope = config.leaky_slope if leaky_slope is None else leaky_slope
        self.slope = slope.reshape(-1, 1, 1) if isinstance(slope, Tensor) else slope
        self.multipliers = [self._multiplier(l) for l in range(1, self.depth + 1)]

    def _multiplier(self, layer: int) -> float:
        fan_in = self.dims[layer - 1]
        p = self.config.parameterization
        if p == "standard":
            return 1.0
        if p == "mean_field" and layer == self.depth and self.depth > 1:
            return 1.0 / fan_in
        return 1.0 / math.sqrt(fan_in)

    def base_std(self, layer: int) -> float:
        """Init std of the entries of W_layer for init_scale 1 (init_norm ``fan_in``)."""
        if self.config.parameterization == "standard":
            return 1.0 / math.sqrt(self.dims[layer - 1])
        return 1.0

    def members(self, s: int, e: int) -> EnsembleMLP:
        """The same net for members ``[s, e)`` only (their slopes): metrics in blocks."""
        slope = self.slope
        return EnsembleMLP(
            self.config,
            self.dims[0],
            self.dims[-1],
            leaky_slope=slope.reshape(-1)[s:e] if isinstance(slope, Tensor) else slope,
        )

    # -- forward / backward ----------------------------------------------------------
    def forward(self, params: Params, x: Tensor) -> Forward:
        """x: (E, n, n_0) → cached pre- and post-activations; output (E, n, n_L)."""
        pre: list[Tensor] = []
        post = [x]
        h = x
        for l, (w, c) in enumerate(zip(params.weights, self.multipliers)):
            if params.biases is not None:
                z = torch.baddbmm(params.biases[l].unsqueeze(1), h, w.transpose(1, 2), alpha=c)
            else:
                z = torch.bmm(h, w.transpose(1, 2))
                if c != 1.0:
                    z = z.mul_(c)
            pre.append(z)
            if l < self.depth - 1:
                h = self.act.phi(z, self.slope)
                post.append(h)
        return Forward(pre, post)

    def __call__(self, params: Params, x: Tensor) -> Tensor:
        return self.forward(params, x).output

    def backward(self, params: Params, fwd: Forward, grad_out: Tensor) -> Params:
        """Gradients of Σ_members ⟨grad_out, f⟩ w.r.t. every parameter (member-wise).

        grad_out: (E, n, n_L) = ∂L/∂f. Returns Params of the same shapes as ``params``.
        """
        gw: list[Tensor] = [None] * self.depth  # type: ignore[list-item]
        gb: list[Tensor] | None = None if params.biases is None else [None] * self.depth  # type: ignore[list-item]
        delta = grad_out  # ∂L/∂z_l
        for l in range(self.depth - 1, -1, -1):
            c = self.multipliers[l]
            gw[l] = torch.bmm(delta.transpose(1, 2), fwd.post[l])
            if c != 1.0:
                gw[l].mul_(c)
            if gb is not None:
                gb[l] = delta.sum(1)
            if l > 0:
                back = torch.bmm(delta, params.weights[l])
                if c != 1.0:
                    back.mul_(c)
                delta = self.act.grad(back, fwd.pre[l - 1], fwd.post[l], self.slope)
        return Params(gw, gb)


def loss_and_grads(
    net: EnsembleMLP, params: Params, x: Tensor, y: Tensor
) -> tuple[Tensor, Params, Tensor]:
    """Per-member loss (E,), its gradients, and the outputs (E, n, k)."""
    fwd = net.forward(params, x)
    out = fwd.output
    resid = out - y
    loss = 0.5 * resid.square().sum((1, 2)) / x.shape[1]
    grads = net.backward(params, fwd, resid.div_(x.shape[1]))
    return loss, grads, out


# -- the training step, in cache-sized blocks of members ----------------------------------

#: Working set (bytes) of one block of members on CPU (see :class:`EnsembleStep`): well
#: inside a core's L2. Smaller blocks pay the per-call overhead of a block's dozen batched
#: calls more often, larger ones spill out of L2. Measured on the project's 2-core AVX-512
#: machines (2 MiB L2 per core): 1.5 MiB gives 13 members at width 32, 6 at width 64, 2 at
#: width 128 and 1 from width 256 on, each within a few percent of the best block size
#: (3 MiB, 12 members at width 64, is 7% slower); one block of a whole 256-member chunk at
#: width 64 runs at less than half the speed (its activations stream from memory). On a
#: 2-core AMD EPYC (1 MiB L2 per core, 32 MiB L3; 64 members, depth 3, n 128, 200 steps,
#: budgets 0.25 to 3 MiB) 1.5 MiB is within 3% of the best (2 to 3 MiB, whose blocks the
#: L3 still holds) at widths 16 to 128, and 0.25 MiB is 4-23% slower: the budget holds
#: across both caches.
CPU_BLOCK_BYTES = 3 << 19


#: Fewest input features for which members that share their input train their first layer
#: as one GEMM per block (see :class:`EnsembleStep`). Measured on the project's 2-core
#: machines (float64, one thread, steps of a two-layer ReLU net): at input_dim 100 (n 256 to
#: 1024, width 32 to 256) and 784 the wide GEMM is 5-15% faster per step; at input_dim 10,
#: where the first layer is a small part of the step, the transposed layout it needs is
#: 3-5% slower. Nothing measured in between: 32 splits the two.
SHARED_MIN_INPUT_DIM = 32

#: Least fraction of the weights in the first layer for the shared-input path: deeper
#: layers read z_1 transposed, which costs a few percent where they do most of the work.
#: Measured (float64, one thread): first layer 85% of the weights (n 256, input_dim 100,
#: width 16, depth 3): 29% faster per step; 16% (input_dim 100, width 512, depth 3) and
#: 20% (input_dim 64, width 128, depth 4): 2-3% slower.
SHARED_MIN_FIRST_LAYER = 0.5

#: Members that share their input go at least input_dim // width to a block, but no more
#: than this many, even where one member's activations already exceed
#: :data:`CPU_BLOCK_BYTES`. Where x is wider than a hidden layer, reading it
#: once for several members pays; where it is narrower, more members' activations only
#: spill the cache. Measured (float64, one thread, two-layer nets, 8 members): input_dim
#: 784, width 128, n 512: blocks of 4-8 6-7% faster than blocks of 1; input_dim 100, width
#: 32, n 1024: blocks of 2-4 9% faster; input_dim 100, width 256: blocks of 1-4 alike;
#: input_dim 32, width 256, n 256: blocks of 4 18% slower than blocks of 1.
SHARED_MIN_BLOCK = 4


#: Part of an accelerator's free memory (measured when a step lays out its blocks) that one
#: block may take: the rest stays for the metrics, the trainer's copies of θ and other
#: trials sharing the device (a fractional ``--gpus-per-trial``).
DEVICE_MEMORY_FRACTION = 0.5


def free_device_bytes(device: torch.device) -> int | None:
    """Free memory of ``device`` in bytes (CUDA: ``torch.cuda.mem_get_info``); None for the
    CPU and for devices that do not report it."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return None


def block_budget(device: torch.device) -> int | None:
    """Bytes one block of members may touch on ``device``: :data:`CPU_BLOCK_BYTES` (a cache)
    on CPU, :data:`DEVICE_MEMORY_FRACTION` of the free memory on a device that reports
    it, else None (no limit: one block holds the ensemble)."""
    if device.type == "cpu":
        return CPU_BLOCK_BYTES
    free = free_device_bytes(device)
    return None if free is None else int(DEVICE_MEMORY_FRACTION * free)


def block_bytes_per_member(
    dims: Sequence[int], n_rows: int, itemsize: int, shared_input: bool = False
) -> int:
    """Bytes one member touches in a step: inputs (unless the block shares them, see
    :func:`shares_input`), activations, a scratch, and weights."""
    n_params = sum(a * b for a, b in zip(dims[:-1], dims[1:]))
    rows = n_rows * (sum(dims[int(shared_input) :]) + max(dims[1:]))
    return itemsize * (rows + n_params)


def shares_input(x: Tensor) -> bool:
    """Whether every member sees the same input rows: ``x`` (E, n, d) is one (n, d) matrix
    expanded over the members (stride 0 along E, as :func:`pipeline.data._datasets.stack` and
    the trainer's minibatches build it when the members' inputs are equal). O(1): the
    equality was established once, where the view was made."""
    return x.dim() == 3 and x.shape[0] > 1 and x.stride(0) == 0


class _Block:
    """Views of one block of members ``[s, e)`` into parameters and buffers (built once).

    ``shared``: the block's members share their input (see :class:`EnsembleStep`): the
    first layer's pre-activations and back-propagated scratch are then stored transposed,
    (b, n_1, n) contiguous, so that all members' z_1ᵀ is one (b·n_1, n) matrix, and
    ``w1`` (b·n_1, n_0) views all members' W_1 as one.
    """

    def __init__(
        self,
        params: Params,
        bufs: list[Tensor],
        per_member: list[Tensor],
        dims: Sequence[int],
        s: int,
        e: int,
        slope: activations.Slope,
        shared: bool = False,
    ):
        L, b = len(params.weights), e - s
        self.shared = shared
        self.s, self.e = s, e
        self.slope = slope[s:e] if isinstance(slope, Tensor) else slope
        self.w = [w[s:e] for w in params.weights]
        self.wt = [w.transpose(1, 2) for w in self.w]
        self.bias = None if params.biases is None else [v[s:e] for v in params.biases]
        self.bias_in = None
        if self.bias is not None:  # broadcast over rows (hidden), over columns (output, transposed)
            self.bias_in = [v.unsqueeze(1) for v in self.bias[:-1]] + [self.bias[-1].unsqueeze(2)]
        self.z = [buf[:b] for buf in bufs[:L]]
        self.zt = [z.transpose(1, 2) for z in self.z]
        n_back = len(bufs) - L
        self.back = [None] + [bufs[L + l % n_back][:b, :, : dims[l]] for l in range(1, L)]
        flat = self.z[L - 1].view(b, 1, -1)  # fᵀ as one row per member
        self.flat, self.flat_t = flat, flat.transpose(1, 2)
        self.sq, self.scale = (t[s:e] for t in per_member)
        if shared:  # bufs[0] is (b, n_1, n): z_1ᵀ; the scratch's first layer likewise
            self.zt[0], self.z[0] = self.z[0], self.z[0].transpose(1, 2)
            scratch = bufs[L + 1 % n_back]
            self.back_t1 = scratch.view(-1)[: self.zt[0].numel()].view(self.zt[0].shape)
            self.back[1] = self.back_t1.transpose(1, 2)
            self.w1 = self.w[0].view(-1, dims[0])
            self.z1 = self.zt[0].view(-1, self.zt[0].shape[2])
            self.bias1 = None if self.bias is None else self.bias[0].view(-1, 1)


class EnsembleStep:
    """Forward, loss and hand-written backward of a whole ensemble, in blocks of members.

    Computes what :func:`loss_and_grads` computes (equal up to round-off), but:

    - members are processed in blocks of ``block`` whose working set stays in cache
      (on CPU; on a GPU one block holds the whole ensemble where half the free memory
      holds it, else as many members as do: :func:`block_budget`): members never mix,
      and a batched matmul over a few members is several times faster per FLOP than
      one over a chunk whose activations stream from memory;
    - activations live in preallocated buffers and are overwritten in place (φ in
      place, the mask of φ' read off h = φ(z), δ written over h);
    - the forward multipliers and 1/n enter the matmuls as ``alpha``, and the targets
      the output matmul as ``beta = -1`` (bias-free nets), not as passes;
    - the output layer is computed transposed, fᵀ = c W hᵀ (k × n): a few long rows,
      which batched gemm does several times faster than n rows of k for small k;
    - :meth:`step` fuses the update into the backward: with the residual scaled by η
      per member, ``W ← W − c δᵀh`` is one ``baddbmm_`` per layer while the block is
      in cache, and no gradient tensor is written;
    - members that share their input (``x`` one (n, d) matrix expanded over E, see
      :func:`shares_input`; e.g. a grid over init scale, width and lr on one data set)
      train their first layer as one GEMM per block: their W_1 stacked are one
      (b·n_1, n_0) matrix, so z_1ᵀ = c W_1 xᵀ (b·n_1 × n) and W_1 ← W_1 − c δ_1ᵀ x are
      one wide ``addmm`` each instead of b narrow ones, x is read once per block, and a
      member's working set no longer holds a copy of x (blocks grow; see
      :data:`SHARED_MIN_BLOCK`). The cost: z_1 and the scratch behind δ_1 are stored
      transposed, (b, n_1, n), so that every member's rows are one matrix, and the
      second layer reads them as transposed operands; worth it only where the first
      layer is a large part of the step (:data:`SHARED_MIN_INPUT_DIM`,
      :data:`SHARED_MIN_FIRST_LAYER`). Deeper layers
      are as above; nets without a hidden layer are not concerned.

    No host synchronisation and no loop over members (only over blocks of them).
    Views of the parameters are cached per ``Params`` object; update parameters in
    place (as the trainer does) to keep the cache valid.
    """

    def __init__(
        self,
        net: EnsembleMLP,
        n_members: int,
        block: int | None = None,
        budget: int | None = None,
    ) -> None:
        self.net = net
        self.E = n_members
        self.block = block
        self.budget = budget
        self._budgets: dict[torch.device, int | None] = {}  # block_budget, once per device
        self._cache: dict[tuple, tuple[list[Tensor], list[Tensor], list[_Block]]] = {}
        self._data: tuple[tuple, list[tuple[Tensor, Tensor]]] | None = None
        # one slope for every member is a float: the activation's in-place kernels take it
        self._slope = net.slope
        if isinstance(net.slope, Tensor):
            flat = net.slope.reshape(-1)
            if flat.numel() and bool((flat == flat[0]).all()):
                self._slope = float(flat[0])
        self._c = tuple(net.multipliers)
        # linear nets: δ is the back-propagated scratch itself, so two of them alternate
        self._n_back = 2 if net.act.identity else 1

    def shared(self, params: Params, x: Tensor) -> bool:
        """Whether the first layer runs as one GEMM per block (see the class docstring):
        the members share ``x`` (:func:`shares_input`) of at least
        :data:`SHARED_MIN_INPUT_DIM` features, the net has a hidden layer holding at least
        :data:`SHARED_MIN_FIRST_LAYER` of the weights, and W_1 (and b_1) are contiguous,
        so that a block's are one matrix."""
        b1 = params.biases
        return (
            self._wide(x)
            and params.weights[0].is_contiguous()
            and (b1 is None or b1[0].is_contiguous())
        )

    def _wide(self, x: Tensor) -> bool:
        dims = self.net.dims
        first = dims[0] * dims[1]
        return (
            self.net.depth > 1
            and dims[0] >= SHARED_MIN_INPUT_DIM
            and first >= SHARED_MIN_FIRST_LAYER * sum(a * b for a, b in zip(dims, dims[1:]))
            and shares_input(x)
        )

    def block_size(self, x: Tensor, shared: bool | None = None) -> int:
        """Most members per block for inputs ``x`` (E, n, d): as many as fit the budget
        (``budget`` if given, else :func:`block_budget` of x's device, measured at the
        first call: a cache on CPU, part of the memory free then on a GPU; a shared input
        counted once, not per member),
        the whole ensemble where there is no budget. Blocks are of equal size (±1) up to
        this. ``shared``: whether the block's first layer is one GEMM (:meth:`shared`;
        None: as it would be for contiguous weights); then at least input_dim // width
        members (up to :data:`SHARED_MIN_BLOCK`)."""
        if self.block is not None:
            return max(1, min(self.block, self.E))
        budget = self.budget
        if budget is None:  # measured once: free memory is a host query (and a sync) on CUDA
            if x.device not in self._budgets:
                self._budgets[x.device] = block_budget(x.device)
            budget = self._budgets[x.device]
        if budget is None:
            return self.E
        shared = self._wide(x) if shared is None else shared
        per = block_bytes_per_member(self.net.dims, x.shape[1], x.element_size(), shared)
        dims = self.net.dims
        least = min(SHARED_MIN_BLOCK, max(1, dims[0] // dims[1])) if shared else 1
        return max(1, min(self.E, max(least, budget // per)))

    def blocks_for(self, params: Params, x: Tensor) -> tuple[list[Tensor], list[_Block]]:
        shared = self.shared(params, x)
        b, n = self.block_size(x, shared), x.shape[1]
        tensors = params.tensors()
        key = (b, n, x.dtype, x.device, shared)
        hit = self._cache.get(key)
        if hit is not None:
            cached, bufs, blocks = hit
            if len(cached) == len(tensors) and all(map(operator.is_, cached, tensors)):
                return bufs, blocks
        else:
            dims = self.net.dims
            new = lambda *s: torch.empty(*s, dtype=x.dtype, device=x.device)  # noqa: E731
            bufs = [new(b, n, w) for w in dims[1:-1]] + [new(b, dims[-1], n)]
            if shared:  # z_1 transposed
                bufs[0] = new(b, dims[1], n)
            # back-propagated δ before φ': one scratch, since δ is written over h, except for
            # linear nets, whose δ is the scratch itself and ping-pongs between two
            bufs += [new(b, n, max(dims[1:])) for _ in range(self._n_back)]
            bufs += [new(self.E, 1, 1), new(self.E, 1, 1)]  # Σ resid², and η/n per member
            if len(self._cache) >= 4:  # e.g. minibatch and full batch: a few shapes at most
                self._cache.clear()
        # blocks of equal size (±1), none larger than b
        blocks = [
            _Block(params, bufs[:-2], bufs[-2:], self.net.dims, s, e, self._slope, shared)
            for s, e in equal_blocks(self.E, b)
        ]
        # the cache holds the tensors themselves, so their ids cannot be reused meanwhile
        self._cache[key] = (tensors, bufs, blocks)
        return bufs, blocks

    def reset(self) -> None:
        """Drop the cached views and buffers; the next call lays them out afresh. A CUDA
        graph captured after this owns the buffers it writes (they are allocated during
        the capture, in its memory pool)."""
        self._cache.clear()
        self._data = None

    def _data_for(self, x: Tensor, y: Tensor, blocks: list[_Block]) -> list[tuple[Tensor, Tensor]]:
        if self._data is not None:
            (cx, cy, cb), data = self._data
            if cx is x and cy is y and cb is blocks:
                return data
        # a shared input enters as its one (n, d) matrix
        data = [
            (x[k.s] if k.shared else x[k.s : k.e], y[k.s : k.e].transpose(1, 2)) for k in blocks
        ]
        self._data = ((x, y, blocks), data)
        return data

    # -- one block -------------------------------------------------------------------------
    def _block(self, k: _Block, x: Tensor, y_t: Tensor, scaled: bool, grads: Params | None) -> None:
        L, c, act = self.net.depth, self._c, self.net.act
        posts = [x]
        h = x
        for l in range(L - 1):
            z = k.z[l]
            if l == 0 and k.shared:  # z_1ᵀ = c W_1 xᵀ (+ b_1) of every member at once
                if k.bias1 is not None:
                    torch.addmm(k.bias1, k.w1, x.t(), alpha=c[0], out=k.z1)
                else:
                    torch.addmm(k.z1, k.w1, x.t(), beta=0.0, alpha=c[0], out=k.z1)
            elif k.bias_in is not None:
                torch.baddbmm(k.bias_in[l], h, k.wt[l], alpha=c[l], out=z)
            elif c[l] == 1.0:
                torch.bmm(h, k.wt[l], out=z)
            else:
                torch.baddbmm(z, h, k.wt[l], beta=0.0, alpha=c[l], out=z)
            h = act.phi_(z, k.slope)
            posts.append(h)
        out_t = k.z[L - 1]
        h_t = k.zt[L - 2] if L > 1 and h is k.z[L - 2] else h.transpose(1, 2)
        # the residual, transposed
        if k.bias_in is not None:
            torch.baddbmm(k.bias_in[L - 1], k.w[L - 1], h_t, alpha=c[L - 1], out=out_t)
            out_t.sub_(y_t)
        else:
            torch.baddbmm(y_t, k.w[L - 1], h_t, beta=-1.0, alpha=c[L - 1], out=out_t)
        torch.bmm(k.flat, k.flat_t, out=k.sq)
        if not scaled:  # loss only
            return
        # δ_L = ∂L/∂f = resid / n, times η when the update is fused; δᵀ for the top layer
        delta_t = out_t.mul_(k.scale)
        delta = k.zt[L - 1]
        for l in range(L - 1, -1, -1):
            back = k.back[l]
            if l == 1 and k.shared:  # into the transposed scratch: backᵀ = c W_2ᵀ δ_2ᵀ
                bt = k.back_t1
                torch.baddbmm(bt, k.wt[1], delta_t, beta=0.0, alpha=c[1], out=bt)
            elif back is not None:
                torch.baddbmm(back, delta, k.w[l], beta=0.0, alpha=c[l], out=back)
            wide = l == 0 and k.shared  # W_1 ← W_1 − c δ_1ᵀ x, all members as one GEMM
            d1 = delta_t.reshape(k.w1.shape[0], -1) if wide else None
            if grads is None:  # fused update θ ← θ − η∇L (η is inside δ)
                if wide:
                    k.w1.addmm_(d1, x, alpha=-c[0])
                else:
                    k.w[l].baddbmm_(delta_t, posts[l], alpha=-c[l])
                if k.bias is not None:
                    k.bias[l].sub_(delta_t.sum(2))
            else:
                gw = grads.weights[l][k.s : k.e]
                if wide:
                    gw = gw.view(k.w1.shape)
                    torch.addmm(gw, d1, x, beta=0.0, alpha=c[0], out=gw)
                else:
                    torch.baddbmm(gw, delta_t, posts[l], beta=0.0, alpha=c[l], out=gw)
                if k.bias is not None:
                    torch.sum(delta_t, 2, out=grads.biases[l][k.s : k.e])
            if back is not None:
                delta = act.grad_(back, k.z[l - 1], posts[l], k.slope)
                delta_t = k.zt[l - 1] if delta is k.z[l - 1] else delta.transpose(1, 2)

    def _run(
        self,
        params: Params,
        x: Tensor,
        y: Tensor,
        eta: Tensor | None,
        grads: Params | None,
        backward: bool = True,
    ) -> Tensor:
        E, n = self.E, x.shape[1]
        bufs, blocks = self.blocks_for(params, x)
        data = self._data_for(x, y, blocks)
        sq, scale = bufs[-2].view(E), bufs[-1].view(E)
        if backward:
            if eta is None:
                scale.fill_(1.0 / n)
            else:
                torch.mul(eta, 1.0 / n, out=scale)
        for k, (xb, yb) in zip(blocks, data):
            self._block(k, xb, yb, backward, grads)
        return sq * (0.5 / n)

    def loss(self, params: Params, x: Tensor, y: Tensor) -> Tensor:
        """Per-member loss (E,) at θ, L = 1/(2n) Σ_i ‖f(x_i) − y_i‖², in blocks."""
        return self._run(params, x, y, None, None, backward=False)

    def loss_and_grads(
        self, params: Params, x: Tensor, y: Tensor, grads: Params | None = None
    ) -> tuple[Tensor, Params]:
        """Per-member loss (E,) and gradients at θ, as :func:`loss_and_grads` (no outputs).

        ``grads``: Params to write the gradients into (allocated if None).
        """
        if grads is None:
            grads = Params(
                [torch.empty_like(w) for w in params.weights],
                None if params.biases is None else [torch.empty_like(v) for v in params.biases],
            )
        return self._run(params, x, y, None, grads), grads

    def step(self, params: Params, x: Tensor, y: Tensor, eta: Tensor) -> Tensor:
        """One gradient step in place, θ ← θ − η ∇L(θ), with η (E,) per member.

        Returns the per-member loss (E,) at θ before the update.
        """
        return self._run(params, x, y, eta, None)
