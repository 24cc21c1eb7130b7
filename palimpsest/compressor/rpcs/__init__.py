"""The Compressor's RPCs, one class by what they serve; palimpsest.compressor.servicer joins them."""
