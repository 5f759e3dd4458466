# Figure 6(b): Stage I with the 'query_positive' query weighting in place of the focal weight of eq. (5); the formulas
# are in loss.py (the paper names the variants without formulas). Compare with config/stage1.py's Stage I.
#   torchrun --nproc_per_node=8 train.py config/weighting_query_positive.py
out_dir = "out/weighting_query_positive"
weighting = "query_positive"
