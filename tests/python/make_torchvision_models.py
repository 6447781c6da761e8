#!/usr/bin/env python3
"""Scripts two torchvision models for ckcheck's end-to-end tests and saves them in OUT_DIR:

  resnet18.pt  torchvision's ResNet-18 (BatchNorm in every block)
  vit.pt       a small VisionTransformer with dropout (its head zero-initialised, as torchvision
               does)

Exits 77 (the tests count it as skipped) when torch or torchvision cannot be imported.
"""
import os
import sys

try:
    import torch
    import torchvision
except Exception as e:  # noqa: BLE001 - any import failure means: no Python side here
    print(f"skipping: {e}")
    sys.exit(77)

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
torch.manual_seed(0)
resnet = torchvision.models.resnet18(num_classes=10).train()
torch.jit.script(resnet).save(os.path.join(out, "resnet18.pt"))
vit = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                           hidden_dim=32, mlp_dim=64, dropout=0.1,
                                           attention_dropout=0.1, num_classes=10).train()
torch.jit.script(vit).save(os.path.join(out, "vit.pt"))
print("saved", os.listdir(out))
