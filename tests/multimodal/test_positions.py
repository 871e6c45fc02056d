"""mRoPE position ids against transformers' get_rope_index: two images of different grids with text
between and after, and a video whose frames are separated by timestamp text."""

import torch

from hotpath.multimodal.inputs import MultiModalItem
from hotpath.multimodal.positions import MropeLayout

IMG, VID = 500, 501


def test_layout_matches_transformers_rope_index():
    import transformers

    config = transformers.Qwen3VLConfig(
        text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, vocab_size=512),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
                           deepstack_visual_indexes=[0]),
        image_token_id=IMG, video_token_id=VID)
    model = transformers.Qwen3VLModel(config)
    # text, an image of 2 x 3 merged tokens, text, an image of 4 x 2, text, a video of two
    # temporal steps of 2 x 2 each with text between them, text
    grids = [(1, 4, 6), (1, 8, 4)]
    video = (2, 4, 4)
    ids = [7] * 3 + [IMG] * 6 + [8] * 2 + [IMG] * 8 + [9] * 4 + [VID] * 4 + [10] * 3 + [VID] * 4 + [11] * 5
    spans, at = [], 0
    for token in (IMG, IMG, VID, VID):
        start = ids.index(token, at)
        end = start
        while end < len(ids) and ids[end] == token:
            end += 1
        spans.append((start, end - start))
        at = end
    items = [MultiModalItem("image", [spans[0]], grids[0], torch.empty(0), torch.empty(0), "a", 2),
             MultiModalItem("image", [spans[1]], grids[1], torch.empty(0), torch.empty(0), "b", 2),
             MultiModalItem("video", spans[2:], video, torch.empty(0), torch.empty(0), "c", 2)]
    types = torch.tensor([[1 if t == IMG else 2 if t == VID else 0 for t in ids]])
    want, delta = model.get_rope_index(torch.tensor([ids]), mm_token_type_ids=types,
                                       image_grid_thw=torch.tensor(grids), video_grid_thw=torch.tensor([video]))
    layout = MropeLayout(items, merge_size=2)
    assert layout.rope_delta == int(delta)
    for start, end in ((0, len(ids)), (5, 17), (20, 31), (len(ids) - 3, len(ids) + 4)):
        got, visual = layout.positions(start, end)
        for i, t, h, w in visual:
            assert got[i] == -1
            got[i] = (t, h, w)
        for j, p in enumerate(got):
            index = start + j
            if index < len(ids):
                expected = tuple(int(x) for x in want[:, 0, index])
                assert (p if isinstance(p, tuple) else (p, p, p)) == expected, (index, p, expected)
            else:  # past the prompt: decode positions, index + rope_delta
                assert p == index + layout.rope_delta
