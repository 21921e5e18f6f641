"""Turn an evaluation video into a small GIF that a results page can show inline (GitHub plays no mp4 there).

    python ppo_continuous.py --eval-checkpoint RUN/checkpoint.pt --capture-video --eval-episodes 1
    python benchmarks/clip_gif.py videos/RUN/eval-at-step-N/rl-video-episode-0.mp4 hopper.gif

The GIF keeps the first --seconds of the video, at --fps frames a second, scaled to --width pixels wide, and
plays at the video's own speed. It is refused (nothing written) if it would be --max-kb or larger: use fewer
seconds, frames or pixels.
"""

import argparse
import io
import sys
from pathlib import Path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("video", type=Path, help="an mp4 written by --capture-video")
    parser.add_argument("gif", type=Path, help="the GIF to write")
    parser.add_argument("--seconds", type=float, default=10.0, help="keep this many seconds from the start")
    parser.add_argument("--fps", type=float, default=15.0, help="frames per second of the GIF")
    parser.add_argument("--width", type=int, default=240, help="width in pixels (the height follows)")
    parser.add_argument("--max-kb", type=int, default=1000, help="refuse a GIF this large or larger")
    args = parser.parse_args(argv)
    if not args.video.is_file():
        sys.exit(f"clip_gif.py: error: no such video: {args.video}")
    if args.seconds <= 0 or args.fps <= 0 or args.width < 16:
        sys.exit("clip_gif.py: error: --seconds and --fps must be > 0, --width at least 16")

    from moviepy import VideoFileClip
    from PIL import Image

    with VideoFileClip(str(args.video)) as clip:
        seconds = min(args.seconds, clip.duration)
        frames = [Image.fromarray(frame) for frame in clip.subclipped(0, seconds).iter_frames(fps=args.fps)]
    height = round(frames[0].height * args.width / frames[0].width)
    frames = [f.resize((args.width, height), Image.Resampling.LANCZOS) for f in frames]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:], loop=0,
                   duration=round(1000 / args.fps), optimize=True)
    size_kb = len(buffer.getvalue()) / 1000
    if size_kb >= args.max_kb:
        sys.exit(f"clip_gif.py: error: the GIF would be {size_kb:.0f} kB (--max-kb {args.max_kb}): "
                 "use fewer --seconds, a lower --fps or a smaller --width")
    args.gif.write_bytes(buffer.getvalue())
    print(f"{args.gif}: {len(frames)} frames, {args.width}x{height}, {seconds:.1f} s, {size_kb:.0f} kB")


if __name__ == "__main__":
    main()
