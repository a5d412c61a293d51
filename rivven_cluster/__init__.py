"""rivven_cluster"""
