import json, sys, numpy as np, torch
from pathlib import Path
from safetensors.torch import save_file
def make(root, n=12):
    root=Path(root)
    _make(root,n)
    return root
def _make(root,n):
    for d in ["index","latents","sem","meta","text"]: (root/d).mkdir(parents=True, exist_ok=True)
    T,h,w = 3,4,6; F,H,W = 9,64,96
    keys = ["NULL_PROMPT","a","b"]
    save_file({k: torch.randn(16,64).bfloat16() for k in keys}, str(root/"text/table.safetensors"))
    rows=[]
    for i in range(n):
        cid=f"c{i:03d}"; split = "val" if i%3==0 else "train"
        rows.append(dict(clip_id=cid, run=f"r{i//1}", subset="s", scene="sc", split=split, drop=(i==5), context_keys=["a","b","a"]))
        save_file({"input_latents": torch.randn(48,T,h,w).bfloat16()}, str(root/f"latents/{cid}.safetensors"))
        np.savez_compressed(root/f"sem/{cid}.npz", ids=np.random.randint(0,7,(F,H,W)).astype(np.uint8))
        cam = {"location":[0,0,500],"rotation":[-60,0,0],"projection":"perspective","fov_deg":90.0}
        json.dump({"clip_id":cid,"src_hw":[96,144],"dst_hw":[H,W],"ground_z":[0.0]*F,"cameras":[cam]*F}, open(root/f"meta/{cid}.json","w"))
    (root/"index/clips.jsonl").write_text("".join(json.dumps(r)+"\n" for r in rows))
    (root/"READY").write_text("")
