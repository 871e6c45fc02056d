"""Images and video for the vision-language models (Qwen3-VL, Qwen3.5 image-text).

- inputs.py: MultiModalItem (one image or video, preprocessed, with its placeholder spans) and
  ProcessedPrompt (a prompt's token ids with its items);
- processor.py: MultiModalProcessor, the prompt's placeholders expanded and the media turned
  into the vision tower's pixel rows, equal to transformers' Qwen3VLProcessor;
- config.py: the preprocessing settings read from a checkpoint (preprocessor_config.json,
  video_preprocessor_config.json);
- images.py, videos.py: the pixel arithmetic (RGB, smart resize, normalise, patch order), video
  frame sampling, timestamps and decoding;
- media.py: loading media from URLs, data URLs and local paths under a MediaPolicy;
- positions.py: mRoPE positions; encoder_cache.py: tower outputs cached by content hash.
"""
