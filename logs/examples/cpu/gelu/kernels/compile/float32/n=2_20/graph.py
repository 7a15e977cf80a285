TRACED GRAPH
 ===== __compiled_fn_9_5a89967d_1f6e_46ff_9779_76e0f5cc3201 =====
 site-packages/torch/fx/_lazy_graph_module.py class GraphModule(torch.nn.Module):
    def forward(self, L_x_: "f32[1048576][1]cpu"):
        l_x_ = L_x_

        # File: ops/gelu.py:218 in <lambda>, code: reference=lambda x, a=_approximate: F.gelu(x, approximate=a),
        gelu: "f32[1048576][1]cpu" = torch._C._nn.gelu(l_x_, approximate = 'none');  l_x_ = None
        return (gelu,)
