"""What an image becomes in tokens: packcli's count from the header equals the image processor's own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from packcli.errors import RecordError, TokenizerError
from packcli.vision import ImageRef, image_size, load_processor
from tests.vision import make_image, make_qwen2_vl_processor

SIZES = [(28, 28), (56, 56), (300, 200), (200, 300), (1000, 30), (640, 480), (1920, 1080), (27, 2000), (4000, 3000)]


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_qwen2_vl_processor(tmp_path_factory.mktemp("qwen2_5_vl"))


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_qwen2_vl_count_and_grid_equal_the_image_processor_on_the_pixels(
    qwen_dir: Path, tmp_path: Path, width: int, height: int
) -> None:
    from PIL import Image

    proc = load_processor(str(qwen_dir))
    path = make_image(tmp_path / "im.png", width, height)
    measured = proc.measure(*image_size(ImageRef(path=str(path))))
    with Image.open(path) as im:
        real = proc.image_processor(images=[im.convert("RGB")])
    grid = tuple(int(x) for x in real["image_grid_thw"][0])
    assert measured.grid == grid
    # Qwen2VLProcessor.replace_image_token: image_grid_thw.prod() // merge_size**2 placeholders per image.
    assert measured.count == grid[0] * grid[1] * grid[2] // proc.image_processor.merge_size**2
    assert measured.text == "<|image_pad|>" * measured.count
    assert len(real["pixel_values"]) == grid[0] * grid[1] * grid[2]


def test_the_exif_orientation_turns_the_size_as_the_processors_loader_does(tmp_path: Path) -> None:
    from PIL import Image, ImageOps

    path = make_image(tmp_path / "turned.jpg", 300, 120, exif_orientation=6)
    with Image.open(path) as im:
        loaded = ImageOps.exif_transpose(im)
        assert image_size(ImageRef(path=str(path))) == (loaded.height, loaded.width) == (300, 120)
    data = path.read_bytes()
    assert image_size(ImageRef(data=data)) == (300, 120)


def test_a_missing_or_broken_image_is_a_record_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(RecordError, match=r"image .*nope\.png does not exist"):
        image_size(ImageRef(path=str(tmp_path / "nope.png")))
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not an image")
    with pytest.raises(RecordError, match=r"broken\.png cannot be read as an image"):
        image_size(ImageRef(path=str(broken)))


def test_an_extreme_aspect_ratio_is_refused_by_the_processor_rule(qwen_dir: Path) -> None:
    proc = load_processor(str(qwen_dir))
    with pytest.raises(RecordError, match="refuses a 3000x10 image"):
        proc.measure(10, 3000)


def test_an_unknown_processor_is_refused_in_one_line(tmp_path: Path, qwen_dir: Path) -> None:
    with pytest.raises(TokenizerError, match="no such directory"):
        load_processor(str(tmp_path / "missing"))
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "processor_config.json").write_text('{"processor_class": "FancyVLProcessor"}')
    with pytest.raises(TokenizerError, match="is a FancyVLProcessor, which packcli does not know; known: ") as err:
        load_processor(str(tmp_path / "p"))
    assert "\n" not in str(err.value)


def test_a_png_is_sized_from_its_chunk_headers_without_decoding_its_pixels(tmp_path: Path, monkeypatch: Any) -> None:
    from PIL import Image, ImageFile

    plain = make_image(tmp_path / "plain.png", 640, 480)
    turned = tmp_path / "turned.png"
    exif = Image.Exif()
    exif[0x0112] = 8
    Image.open(plain).save(turned, exif=exif)
    loads: list[str] = []
    real_load = ImageFile.ImageFile.load

    def counted(self: Any) -> Any:
        loads.append(self.format)
        return real_load(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", counted)
    assert image_size(ImageRef(path=str(plain))) == (480, 640)
    assert loads == []  # the pixels were not decoded
    assert image_size(ImageRef(data=plain.read_bytes())) == (480, 640)
    assert loads == []
    # With an EXIF chunk, PIL reads it as the processors' loader does: the size turns.
    assert image_size(ImageRef(path=str(turned))) == (640, 480)


def test_a_missing_pillow_is_one_whole_line_that_says_how_to_install_it(qwen_dir: Path, monkeypatch: Any) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "PIL", None)  # what ``import PIL`` meets where Pillow is not installed
    with pytest.raises(TokenizerError) as err:
        load_processor(str(qwen_dir))
    message = str(err.value)
    assert "\n" not in message
    assert message.endswith("Pillow, which is not installed; install it with pip install pillow")
