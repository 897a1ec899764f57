"""The progress line with an injected stream and clock."""
import io

from scalesgd.io.progress import ProgressLine, Smoothed, format_duration


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_plain_lines_every_n_steps_with_eta_and_smoothing():
    out, clock = io.StringIO(), Clock()
    bar = ProgressLine(total_epochs=10, every=2, stream=out, clock=clock, smoothing=0.5)
    for step in range(1, 5):
        bar.update(step, epoch=0.5 * (step - 1), loss=float(step), error=0.5, images_per_second=1234.0,
                   lr=0.1)
        clock.t += 60.0
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "\r" not in out.getvalue()
    assert lines[0].startswith("step 2 epoch 0.50/10 ETA 19:00 1,234 img/s")   # 60 s per 0.5 epoch
    # bias-corrected EMA of 1, 2, 3, 4 with beta 0.5: (0.5*4+0.25*3+0.125*2+0.0625*1)/(1-0.5**4)
    assert "loss 3.2667" in lines[1] and "top1-err 50.0%" in lines[1] and "lr 0.1" in lines[1]
    bar.message("validation top-1 90%")
    assert out.getvalue().endswith("validation top-1 90%\n")


def test_terminal_redraws_one_line_and_messages_start_a_new_one():
    out, clock = io.StringIO(), Clock()
    bar = ProgressLine(total_epochs=1, stream=out, clock=clock, tty=True, min_interval=1.0, width=80)
    bar.update(1, 0.0, 2.0, 1.0, 10.0)
    bar.update(2, 0.1, 2.0, 1.0, 10.0)            # same instant: not redrawn
    clock.t += 2
    bar.update(3, 0.2, 2.0, 1.0, 10.0)
    text = out.getvalue()
    assert text.count("\r") == 1 and "\n" not in text and "step 3 " in text and "step 2 " not in text
    bar.message("eval")
    bar.close()                                    # nothing more: the bar was already ended
    assert out.getvalue().endswith("\neval\n")
    assert all(len(part) == 80 for part in text.split("\r"))


def test_isatty_of_the_stream_decides_the_mode():
    class Tty(io.StringIO):
        def isatty(self):
            return True
    assert ProgressLine(1, stream=Tty()).tty and not ProgressLine(1, stream=io.StringIO()).tty


def test_helpers():
    assert format_duration(3725) == "1:02:05" and format_duration(65) == "1:05"
    assert format_duration(float("nan")) == "?"
    s = Smoothed(0.9)
    assert s.add(3.0) == 3.0 and abs(s.add(3.0) - 3.0) < 1e-12
