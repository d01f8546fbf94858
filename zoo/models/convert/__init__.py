"""Checkpoint maps between zoo's models and other libraries' formats, one module per format (as litgpt's
convert_hf_checkpoint.py): config fields and weight names, both ways where the format is written too. Pure
dicts and state dicts; the models' entry points (GPT.from_huggingface, ViT.from_torchvision, ...) call them.

    huggingface.py        transformers: GPT-2, Llama / Qwen2 / Mistral (both ways), CLIP
    huggingface_bert.py   transformers: BERT and RoBERTa masked LMs (both ways)
    torchvision.py        torchvision's VisionTransformer
"""
