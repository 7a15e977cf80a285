TRACED GRAPH
 ===== __compiled_fn_1_da4aaf9a_0e0b_4e6a_a1f3_7192141e4c45 =====
 site-packages/torch/fx/_lazy_graph_module.py class GraphModule(torch.nn.Module):
    def forward(self, L_x_: "f32[1000][1]cpu"):
        l_x_ = L_x_

        # File: ops/gelu.py:218 in <lambda>, code: reference=lambda x, a=_approximate: F.gelu(x, approximate=a),
        gelu: "f32[1000][1]cpu" = torch._C._nn.gelu(l_x_, approximate = 'none');  l_x_ = None
        return (gelu,)
