
othera