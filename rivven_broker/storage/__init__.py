"""rivven_broker/storage"""
