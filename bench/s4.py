"""stub"""

def add_arguments(parser):
    pass
