#!/usr/bin/env python3
"""cpu_model_workloads.py — the model workloads of held-out set P (bench/RESULTS.md, session 45): 19
torchvision and torch.nn models, trained or served on a CPU, to be recorded with
tools/record_cpu_trace.py as single-stream allocation traces that no rule of the pool was chosen on.

None of them is in ../shared/traces/models/: other CNNs (resnet50, resnext50, mobilenet v2/v3,
regnet, shufflenet, googlenet, mnasnet, alexnet), a vision transformer (vit_b_32), segmentation
(lraspp) and detection (ssdlite, retinanet), a BERT-style encoder trained at varying sequence length,
a GRU language model, and a GPT decoding token by token with a growing key/value cache. Training runs
2-5 optimizer steps; serving runs requests of varying batch or image size, as a serving loop does.

Usage (Debian's python3-torch and python3-torchvision; /usr/bin/python3 on Debian):
  cpu_model_workloads.py list                  the workload names
  cpu_model_workloads.py NAME                  runs one (what the recorder runs)
  cpu_model_workloads.py --record-all OUTDIR   records every one as OUTDIR/NAME.csv (about 10 min on
                                               2 cores), through tools/record_cpu_trace.py
Seeded (torch.manual_seed(0)), two threads. Exit 2 for an unknown name; 1 when torch or torchvision
is missing.
"""
import os
import random
import subprocess
import sys

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torchvision.models as tvm
    import torchvision.models.detection as tvd
    import torchvision.models.segmentation as tvs
except ImportError as e:
    sys.exit(f'cpu_model_workloads: {e.name} is not installed (Debian: apt-get install python3-torch '
             f'python3-torchvision; run with /usr/bin/python3)')


def train(model, batch, steps, shape=(3, 224, 224), classes=1000, opt='adamw', loss_of=None):
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    if opt == 'adamw':
        o = torch.optim.AdamW(params, lr=1e-4)
    else:
        o = torch.optim.SGD(params, lr=0.01, momentum=0.9)
    for _ in range(steps):
        x = torch.randn(batch, *shape)
        y = torch.randint(0, classes, (batch,))
        out = model(x)
        loss = loss_of(out, y) if loss_of else F.cross_entropy(out, y)
        o.zero_grad(set_to_none=True)
        loss.backward()
        o.step()


def serve(model, batches, shape=(3, 224, 224)):
    model.eval()
    with torch.no_grad():
        for b in batches:
            model(torch.randn(b, *shape))


def seg_loss(out, y):
    o = out['out']
    t = torch.randint(0, o.shape[1], (o.shape[0], o.shape[2], o.shape[3]))
    return F.cross_entropy(o, t)


class BertLike(nn.Module):
    """A BERT-style encoder with a language-model head."""
    def __init__(self, vocab=8000, d=384, layers=6, heads=6):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(512, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        return self.head(self.enc(self.emb(ids) + self.pos(pos)))


def bert_varlen_train():
    m = BertLike()
    o = torch.optim.AdamW(m.parameters(), lr=1e-4)
    m.train()
    for seq in (128, 64, 192, 96):
        ids = torch.randint(0, 8000, (8, seq))
        loss = F.cross_entropy(m(ids).reshape(-1, 8000), ids.reshape(-1))
        o.zero_grad(set_to_none=True)
        loss.backward()
        o.step()


class Decoder(nn.Module):
    """A small GPT decoding with a growing key/value cache (torch.cat per token)."""
    def __init__(self, vocab=16000, d=512, layers=6, heads=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.heads = heads
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers))
        self.proj = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.mlp = nn.ModuleList(nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
                                 for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def forward(self, ids, cache):
        x = self.emb(ids)
        b, t, d = x.shape
        h = self.heads
        for i in range(len(self.qkv)):
            q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in self.qkv[i](x).split(d, dim=2))
            if cache[i] is not None:
                k = torch.cat([cache[i][0], k], 2)
                v = torch.cat([cache[i][1], v], 2)
            cache[i] = (k, v)
            a = F.scaled_dot_product_attention(q, k, v) if hasattr(F, 'scaled_dot_product_attention') else \
                torch.softmax(q @ k.transpose(-1, -2) / (d // h) ** 0.5, -1) @ v
            x = x + self.proj[i](a.transpose(1, 2).reshape(b, t, d))
            x = x + self.mlp[i](x)
        return self.head(x[:, -1])


def gpt_generate_serve():
    m = Decoder().eval()
    with torch.no_grad():
        for batch, prompt, new in ((4, 64, 48), (1, 200, 32), (8, 32, 64), (2, 128, 40)):
            cache = [None] * 6
            ids = torch.randint(0, 16000, (batch, prompt))
            nxt = m(ids, cache).argmax(-1, keepdim=True)
            for _ in range(new):
                nxt = m(nxt, cache).argmax(-1, keepdim=True)


class GRUSeq(nn.Module):
    """A two-layer GRU language model."""
    def __init__(self, vocab=10000, d=384):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.GRU(d, d, 2, batch_first=True)
        self.out = nn.Linear(d, vocab)

    def forward(self, ids):
        return self.out(self.rnn(self.emb(ids))[0])


def gru_varlen_train():
    m = GRUSeq()
    o = torch.optim.Adam(m.parameters(), lr=1e-3)
    for seq in (40, 120, 60, 90, 30):
        ids = torch.randint(0, 10000, (24, seq))
        loss = F.cross_entropy(m(ids).reshape(-1, 10000), ids.reshape(-1))
        o.zero_grad(set_to_none=True)
        loss.backward()
        o.step()


def det_serve(model, sizes):
    model.eval()
    with torch.no_grad():
        for n, s in sizes:
            model([torch.rand(3, s, int(s * 1.25)) for _ in range(n)])


SSD_SIZES = [(1, 320), (2, 480), (1, 640), (4, 320), (2, 400), (1, 512), (3, 360), (1, 300)]
W = {
    'resnet50_train_b8': lambda: train(tvm.resnet50(), 8, 3),
    'mobilenet_v2_train_b16': lambda: train(tvm.mobilenet_v2(), 16, 3, opt='sgd'),
    'mobilenet_v3_small_train_b32': lambda: train(tvm.mobilenet_v3_small(), 32, 3),
    'regnet_y_400mf_train_b16': lambda: train(tvm.regnet_y_400mf(), 16, 3),
    'shufflenet_v2_train_b32': lambda: train(tvm.shufflenet_v2_x1_0(), 32, 3, opt='sgd'),
    'googlenet_train_b8': lambda: train(tvm.googlenet(aux_logits=False, init_weights=True), 8, 3),
    'mnasnet_train_b16': lambda: train(tvm.mnasnet1_0(), 16, 3),
    'resnext50_train_b4': lambda: train(tvm.resnext50_32x4d(), 4, 2),
    'vit_b_32_train_b8': lambda: train(tvm.vit_b_32(), 8, 2),
    'lraspp_train_b4': lambda: train(tvs.lraspp_mobilenet_v3_large(num_classes=21, weights_backbone=None), 4, 3,
                                     shape=(3, 256, 256), loss_of=seg_loss, opt='sgd'),
    'bert_varlen_train': bert_varlen_train,
    'gru_varlen_train': gru_varlen_train,
    'resnet50_serve': lambda: serve(tvm.resnet50(), [1, 8, 2, 16, 4, 1, 32, 8, 2, 4]),
    'mobilenet_v3_large_serve': lambda: serve(tvm.mobilenet_v3_large(), [1, 4, 16, 2, 32, 8, 1, 64, 4, 16, 2, 8]),
    'alexnet_serve': lambda: serve(tvm.alexnet(), [1, 16, 4, 64, 8, 2, 32, 1]),
    'vit_b_32_serve': lambda: serve(tvm.vit_b_32(), [1, 8, 2, 16, 4, 32, 1, 8]),
    'ssdlite_serve': lambda: det_serve(tvd.ssdlite320_mobilenet_v3_large(weights_backbone=None, num_classes=91),
                                       SSD_SIZES),
    'retinanet_serve': lambda: det_serve(tvd.retinanet_resnet50_fpn(weights_backbone=None, num_classes=91),
                                         [(1, 400), (2, 320), (1, 512), (1, 360)]),
    'gpt_generate_serve': gpt_generate_serve,
}


def record_all(outdir):
    """Records every workload into outdir; returns the number that failed."""
    os.makedirs(outdir, exist_ok=True)
    here = os.path.dirname(os.path.abspath(__file__))
    failed = 0
    for name in W:
        r = subprocess.run([sys.executable, os.path.join(here, 'record_cpu_trace.py'),
                            os.path.join(outdir, name + '.csv'), sys.executable, os.path.abspath(__file__), name])
        failed += r.returncode != 0
    return failed


def main(argv):
    if len(argv) == 2 and argv[1] == 'list':
        print(' '.join(W))
        return 0
    if len(argv) == 3 and argv[1] == '--record-all':
        return 1 if record_all(argv[2]) else 0
    if len(argv) != 2 or argv[1] not in W:
        print(f'usage: {argv[0]} list | NAME | --record-all OUTDIR; NAME one of: {" ".join(W)}', file=sys.stderr)
        return 2
    torch.manual_seed(0)
    random.seed(0)
    torch.set_num_threads(2)
    W[argv[1]]()
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
