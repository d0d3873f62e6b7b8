"""Images: what an image becomes in a sample's tokens, asked of the model's own processor.

A vision-language processor turns each image placeholder of the rendered conversation into a number of
image tokens that depends on the image (for Qwen2-VL, on its size; for LLaVA, on nothing). packcli
reads the image's size from its file header (``packcli.vision.images``), never its pixels where the
processor's rule allows, and asks the processor's own functions for the count and the expansion text
(``packcli.vision.processor``). A processor family packcli does not know is refused, never guessed.
"""

from __future__ import annotations

from packcli.vision.images import ImageRef, image_size
from packcli.vision.processor import ImageTokens, VisionProcessor, load_processor

__all__ = ["ImageRef", "ImageTokens", "VisionProcessor", "image_size", "load_processor"]
