"Random frames shared by the parity suites: NaNs, repeats, single-value columns, unseen categories in validation."
import numpy as np, pandas as pd
from hypothesis import strategies as st

@st.composite
def frames(draw, min_rows=4, max_rows=60):
    "(df, n_train): a frame with int, string and multi-hot categorical, float and int continuous columns and two targets"
    n = draw(st.integers(min_rows, max_rows))
    col = lambda el: draw(st.lists(el, min_size=n, max_size=n))
    words = st.sampled_from(['a','b','c','dd','Ée','z'])
    df = pd.DataFrame({
        'ci': pd.array(col(st.one_of(st.none(), st.integers(-3, 5))), dtype='Int64').astype('float64'),
        'cs': pd.Series(col(st.one_of(st.none(), words)), dtype=object).astype('str').where(lambda s: s!='None'),
        'cc': col(st.sampled_from([7])),
        'mh': pd.Series(col(st.one_of(st.none(), st.lists(words, max_size=3).map('|'.join))), dtype=object),
        'xf': col(st.one_of(st.just(np.nan), st.floats(-1e3, 1e3, allow_nan=False, width=32))),
        'xi': col(st.integers(-50, 50)),
        'yc': col(st.sampled_from(['no','yes'])),
        'yr': col(st.floats(-5, 5, width=32)),
    })
    return df, draw(st.integers(1, n-1))

CAT,CONT,MH = ['ci','cs','cc'],['xf','xi'],['mh']

def usable(df, n_train):
    "True if fastai can process it: training has a value in every column, every validation label, and a NaN where validation has one"
    tr,va = df.iloc[:n_train],df.iloc[n_train:]
    if (va[CONT].isna().any() & ~tr[CONT].isna().any()).any(): return False
    return bool(tr[CAT+CONT+MH].notna().any().all()) and set(df['yc'].iloc[n_train:]) <= set(tr['yc'])
