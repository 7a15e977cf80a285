TRACED GRAPH
 ===== AFTER POST GRAD =====
 site-packages/torch/fx/_lazy_graph_module.py class <lambda>(torch.nn.Module):
    def forward(self, arg0_1: "bf16[4096, 50257][50257, 1]cuda:0"):
        # File: ops/softmax/spec.py:23 in softmax_unfused, code: e = torch.exp(x - x.max(dim=-1, keepdim=True).values)
        max_1 = torch.ops.aten.max.dim(arg0_1, -1, True)
        getitem: "bf16[4096, 1][1, 1]cuda:0" = max_1[0];  max_1 = None
        sub: "bf16[4096, 50257][50257, 1]cuda:0" = torch.ops.aten.sub.Tensor(arg0_1, getitem);  arg0_1 = getitem = None
        exp: "bf16[4096, 50257][50257, 1]cuda:0" = torch.ops.aten.exp.default(sub);  sub = None

        # File: ops/softmax/spec.py:24 in softmax_unfused, code: return e / e.sum(dim=-1, keepdim=True)
        sum_1: "bf16[4096, 1][1, 1]cuda:0" = torch.ops.aten.sum.dim_IntList(exp, [-1], True)
        div: "bf16[4096, 50257][50257, 1]cuda:0" = torch.ops.aten.div.Tensor(exp, sum_1);  exp = sum_1 = None
        return (div,)
