"""The launch's progress bar: member-steps trained, points done, rate and ETA."""

from __future__ import annotations

from collections.abc import Sequence

from tqdm.auto import tqdm


class Progress:
    """The progress bar: member-steps trained (rate and ETA from those), points done.

    Trials report the member-steps of their chunk every
    :data:`~phasesweep.pipeline._driver.PROGRESS_EVERY` seconds, so the bar moves during a
    chunk, not only at its end. ``sizes[i]``: chunk i's (members, steps per member).
    """

    def __init__(
        self, sweep: str, sizes: Sequence[tuple[int, int]], done: int, total: int, enabled: bool
    ) -> None:
        self.point_steps = [steps for _, steps in sizes]
        self.live: dict[int, int] = {}  # chunk -> member-steps of its running trial
        self.credited = [0] * len(sizes)  # chunk -> its points known to be done
        self.other = 0  # points done otherwise (failed after retries)
        self.skipped, self.total, self.sweep = done, total, sweep
        self.bar = tqdm(
            total=sum(members * steps for members, steps in sizes),
            unit=" member-steps",
            unit_scale=True,
            disable=not enabled,
            smoothing=0.1,
            mininterval=0.5,
            bar_format="{desc} {percentage:3.0f}%|{bar:20}| {n_fmt}/{total_fmt} "
            "[{elapsed}<{remaining}, {rate_fmt}]",
        )
        self.note("")

    def _show(self) -> None:
        n = sum(c * s for c, s in zip(self.credited, self.point_steps)) + sum(self.live.values())
        self.bar.update(n - self.bar.n)

    def running(self, chunk: int, member_steps: int) -> None:
        """A trial's progress report: member-steps of ``chunk`` trained so far."""
        self.live[chunk] = member_steps
        self._show()

    def finished(self, chunk: int, done: int) -> None:
        """A trial ended with ``done`` points of ``chunk`` stored (by it or others)."""
        self.live.pop(chunk, None)
        self.credited[chunk] = max(self.credited[chunk], done)
        self.note("")

    def points(self, n: int) -> None:
        """``n`` points ended otherwise (failed after retries)."""
        self.other += n
        self.note("")

    def note(self, text: str) -> None:
        """Show points done (and ``text``) beside the bar."""
        done = self.skipped + sum(self.credited) + self.other
        self.bar.set_description_str(
            f"{self.sweep}: {done}/{self.total} points" + (f" ({text})" if text else ""),
            refresh=False,
        )
        self._show()
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()
