TRACED GRAPH
 ===== __compiled_fn_5_fb83db25_b0c0_43ef_9c0a_ee714ef94f80 =====
 site-packages/torch/fx/_lazy_graph_module.py class GraphModule(torch.nn.Module):
    def forward(self, L_x_: "bf16[4096, 50257][50257, 1]cuda:0"):
        l_x_ = L_x_

        # File: ops/softmax/spec.py:42 in <lambda>, code: reference=lambda x: torch.softmax(x, dim=-1),
        softmax: "bf16[4096, 50257][50257, 1]cuda:0" = torch.softmax(l_x_, dim = -1);  l_x_ = None
        return (softmax,)
